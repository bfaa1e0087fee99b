"""Real-looking prose for the copy-heavy workload, generated from a seed (no downloads).

The copy preset asks a model to edit a given text, so its answer copies long spans of the
prompt: the case where n-gram prompt lookup pays. Random token ids would not do (a model does not
reproduce noise the way it reproduces prose), nor would one fixed text (every round and request
of a benchmark needs a fresh prompt, or the prefix cache measures itself). So passages are
written from sentence templates about a small town's affairs, with names, places, numbers and
dates drawn from a seeded generator: grammatical, varied, and the same for the same seed.
"""

from __future__ import annotations

import random

_TOWNS = (
    "Millbrook",
    "Eastwick",
    "Harlow Bay",
    "Stonebridge",
    "Ashford",
    "Clearwater",
    "Redfield",
    "Oakhaven",
    "Northgate",
    "Willowmere",
)
_PEOPLE = (
    "Margaret Ellis",
    "David Okafor",
    "Sofia Lindqvist",
    "Thomas Reyes",
    "Hannah Brooks",
    "Rajesh Patel",
    "Claire Dubois",
    "Samuel Osei",
    "Irene Kowalski",
    "Peter Vance",
    "Lucia Moretti",
    "James Whitaker",
)
_ROLES = (
    "the mayor",
    "the head of the planning office",
    "a local teacher",
    "the chair of the residents' association",
    "the town engineer",
    "a shop owner",
    "the library director",
    "a retired nurse",
)
_PROJECTS = (
    "footbridge over the river",
    "public library extension",
    "community garden",
    "bus route to the hospital",
    "swimming pool renovation",
    "cycle path along the canal",
    "market hall roof",
    "primary school kitchen",
    "flood barrier",
    "youth centre",
)
_PLACES = (
    "the old mill",
    "the railway station",
    "the town square",
    "the harbour",
    "the north road",
    "the church hall",
    "the sports ground",
    "the high street",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_CONCERNS = (
    "the noise during construction",
    "the cost to local taxpayers",
    "parking near the site",
    "the safety of children walking to school",
    "the loss of trees",
    "delays to deliveries",
    "the height of the new building",
    "access for wheelchair users",
)

_NUISANCES = ("noise", "dust", "road closures", "disruption", "lorry traffic", "night work")
_OPENING = "The town council of {town} met on {day} evening to discuss the {project}."
_SENTENCES = (
    "{person}, {role}, said that the work would begin in {month} and last about {n} months.",
    "The estimated cost is {money} pounds, of which the county will pay {pct} percent.",
    "Several residents raised concerns about {concern}.",
    "{person} replied that the contractor had promised to keep {nuisance} to a minimum.",
    "A first survey near {place} found that the ground was {ground} than expected.",
    "Last year, {count} people signed a petition asking for the {project2}.",
    "The meeting ended after {hours} hours with a vote of {yes} to {no} in favour.",
    "According to {person}, the {project} will be open to the public by {month2} next year.",
    "Traffic on {place} will be diverted for {weeks} weeks while the old pipes are replaced.",
    "{person} thanked the volunteers who had cleaned {place} every weekend since {month}.",
    "The plans can be seen at {place} until the end of {month}, and comments are welcome.",
    "Local businesses expect more visitors once the {project2} is finished.",
    "The next public meeting will take place on {day} the {date} of {month2} at {time} o'clock.",
    "{person} asked whether the {project2} could be built at the same time.",
    "Children from the primary school painted a mural for the fence around {place}.",
)
TYPO_RATE = 0.04  # of the words long enough to have one


def edit_sentences(rng: random.Random, count: int) -> list[str]:
    """`count` sentences of one article: the opening, then the other templates in a random
    order (each once before any repeats: repeated sentences invite a model to loop), with a few
    letters swapped for the edit to fix, and a paragraph break before some ("\n\n" prefix)."""
    town, project = rng.choice(_TOWNS), rng.choice(_PROJECTS)
    out: list[str] = []
    templates: list[str] = []
    since_break = 0
    for i in range(count):
        if i == 0:
            template = _OPENING
        else:
            if not templates:
                templates = rng.sample(_SENTENCES, len(_SENTENCES))
            template = templates.pop()
        sentence = _with_typos(rng, _fill(rng, template, town, project))
        # Paragraphs of three to five sentences.
        if since_break >= 3 and (since_break == 5 or rng.random() < 0.4):
            sentence, since_break = "\n\n" + sentence, 0
        out.append(sentence if i == 0 or sentence.startswith("\n") else " " + sentence)
        since_break += 1
    return out


def edit_prompt(sentences: list[str]) -> str:
    """The copy preset's prompt: fix the typos of a quoted text. A base model answers with the
    text itself; the quotes mark where it starts and ends."""
    text = "".join(sentences)
    return f'Original text:\n"""\n{text}\n"""\n\nThe same text with the typos fixed:\n"""\n'


def _fill(rng: random.Random, template: str, town: str, project: str) -> str:
    return template.format(
        town=town,
        project=project,
        project2=rng.choice([p for p in _PROJECTS if p != project]),
        day=rng.choice(_DAYS),
        person=rng.choice(_PEOPLE),
        role=rng.choice(_ROLES),
        month=rng.choice(_MONTHS),
        month2=rng.choice(_MONTHS),
        n=rng.randint(3, 18),
        money=f"{rng.randint(40, 900) * 1000:,}",
        pct=rng.choice((20, 25, 30, 40, 50, 60)),
        concern=rng.choice(_CONCERNS),
        nuisance=rng.choice(_NUISANCES),
        place=rng.choice(_PLACES),
        ground=rng.choice(("softer", "wetter", "harder", "more stable")),
        count=rng.randint(120, 4000),
        hours=rng.choice(("two", "three", "nearly four")),
        yes=rng.randint(6, 12),
        no=rng.randint(0, 5),
        weeks=rng.randint(2, 10),
        date=rng.choice(("first", "third", "eighth", "twelfth", "twentieth")),
        time=rng.randint(5, 8),
    )


def _with_typos(rng: random.Random, sentence: str) -> str:
    """Swap two inner letters of a few longer words ("petition" -> "petiiton")."""
    words = sentence.split(" ")
    for i, word in enumerate(words):
        if len(word) > 4 and word.isalpha() and rng.random() < TYPO_RATE:
            j = rng.randrange(1, len(word) - 2)
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2 :]
    return " ".join(words)
