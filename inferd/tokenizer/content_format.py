"""Whether a chat template reads a message's `content` as a string or as a list of parts.

OpenAI clients may send content as a list of parts (`[{"type": "text", "text": "hi"}]`). Some
templates walk such a list (Gemma's, multimodal ones); most were written for strings and fail on
a list (`'<|im_start|>' + message['content']` raises). The template's own code says which: the
format is read once, when the template compiles, from its syntax tree: a `for` loop over a
message's `content` (directly, through a filter, or through a variable set from it) means the
template takes parts; otherwise it takes strings, and `flatten_text_parts` joins the text parts
before it renders (vLLM's rule: the texts joined by a line break). Jinja is imported only by
the detection, which runs when a template compiles: loading a tokenizer stays free of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import nodes

STRING = "string"  # content must be a string: text parts are joined first
PARTS = "openai"  # the template iterates over OpenAI-style parts itself (vLLM's name)
PART_SEPARATOR = "\n"


def _reads_content(node: nodes.Node | None, aliases: set[str]) -> bool:
    """Whether `node` is a message's content: `m['content']`, `m.content`, `m['content'] | f`,
    or a variable assigned from one of those."""
    from jinja2 import nodes  # local: only a compiling template needs Jinja

    while isinstance(node, nodes.Filter | nodes.Test):
        node = node.node
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    return isinstance(node, nodes.Name) and node.name in aliases


def detect_content_format(tree: nodes.Template) -> str:
    """STRING or PARTS for a parsed template (`Environment.parse`)."""
    from jinja2 import nodes

    aliases = {
        assign.target.name
        for assign in tree.find_all(nodes.Assign)
        if isinstance(assign.target, nodes.Name) and _reads_content(assign.node, set())
    }
    loops = tree.find_all(nodes.For)
    return PARTS if any(_reads_content(loop.iter, aliases) for loop in loops) else STRING


def text_of_parts(parts: list[Any], where: str = "content") -> str:
    """The text of a list of content parts; ValueError naming a part that is not text."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image":
            raise ValueError(f"{where}[{j}]: this model's chat template takes text only: it has "
                             "no place for an image")  # fmt: skip
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(
                f"{where}[{j}]: content parts of type {kind!r} are not supported (only 'text' "
                "parts with a 'text' string)"
            )
        texts.append(part["text"])
    return PART_SEPARATOR.join(texts)


def flatten_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with list contents joined into strings (for STRING templates); a message
    whose content is already a string, or that is not a dict, is passed as it is."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            message = {**message, "content": text_of_parts(content, f"messages[{i}].content")}
        out.append(message)
    return out
