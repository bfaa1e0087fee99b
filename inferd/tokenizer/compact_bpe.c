/* A SentencePiece-style BPE tokenizer over compact tables (compact_bpe.py builds them).

   It computes exactly what HF `tokenizers` computes for the tokenizer inferd builds from a
   Gemma GGUF vocabulary (gguf_vocab.py `_gemma_shape`), with a fraction of its memory: the
   vocabulary is one byte blob with offsets, looked up by binary search over ids sorted by
   their bytes; the merges are sorted (left, right) keys with their rank and result. Steps:

   1. Added tokens are cut out of the text first, leftmost-longest, over the original text
      (they are all "not normalized"): a trie walked from each position. In the "plain" mode
      (HF's `encode_special_tokens`) a special token is still matched, so that it hides the
      tokens overlapping it, but its text stays in the surrounding piece, as HF does.
   2. Each piece between them is one BPE word: spaces read as U+2581, every character is its
      token, or its bytes' <0xNN> tokens (byte fallback), or the unknown token (consecutive
      unknown characters fused); then the pair of lowest rank is merged, leftmost first, until
      no pair has a merge. The queue is ordered by (rank, position), like HF's, so ties and
      stale entries resolve the same way.
   3. Decoding: each token's text with U+2581 read as a space, runs of <0xNN> tokens joined
      into bytes (a run that is not valid UTF-8 becomes one U+FFFD per byte).

   Offsets are byte offsets into the original text: a token spans the characters it came
   from; each byte-fallback token spans its whole character. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t child, sibling, token; /* token: an added token's id ending here, or -1 */
    uint8_t byte, special;
} TrieNode;

typedef struct {
    const uint8_t *blob;      /* token i: blob[offsets[i] .. offsets[i + 1]) */
    const uint32_t *offsets;
    const uint32_t *sorted;   /* all ids, ordered by their bytes */
    int64_t n_tokens;
    const uint64_t *merge_keys; /* (left << 32) | right, ascending */
    const uint32_t *merge_ranks, *merge_ids;
    int64_t n_merges;
    const uint8_t *special;   /* per id: 1 for a special added token */
    int32_t unk_id, byte_ids[256];
    TrieNode *trie;
    int64_t n_nodes;
} Vocab;

enum { MATCH_ALL = 0, MATCH_KEEP_SPECIAL_TEXT = 1, MATCH_SPECIAL_ONLY = 2 };

static int compare_bytes(const uint8_t *a, int64_t na, const uint8_t *b, int64_t nb) {
    int c = memcmp(a, b, (size_t)(na < nb ? na : nb));
    return c ? c : (na > nb) - (na < nb);
}

int64_t inferd_bpe_lookup(const Vocab *v, const uint8_t *text, int64_t n) {
    int64_t lo = 0, hi = v->n_tokens;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        uint32_t id = v->sorted[mid];
        int c = compare_bytes(v->blob + v->offsets[id], v->offsets[id + 1] - v->offsets[id],
                              text, n);
        if (c == 0) return id;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* Index of the merge of (left, right), or -1. */
static int64_t find_merge(const Vocab *v, uint32_t left, uint32_t right) {
    uint64_t key = ((uint64_t)left << 32) | right;
    int64_t lo = 0, hi = v->n_merges;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (v->merge_keys[mid] == key) return mid;
        if (v->merge_keys[mid] < key) lo = mid + 1; else hi = mid;
    }
    return -1;
}

static int64_t trie_child(Vocab *v, int64_t node, uint8_t byte, int create) {
    int64_t prev = -1;
    for (int64_t c = v->trie[node].child; c >= 0; prev = c, c = v->trie[c].sibling)
        if (v->trie[c].byte == byte) return c;
    if (!create) return -1;
    int64_t c = v->n_nodes++;
    v->trie[c] = (TrieNode){-1, -1, -1, byte, 0};
    if (prev < 0) v->trie[node].child = (int32_t)c; else v->trie[prev].sibling = (int32_t)c;
    return c;
}

void inferd_bpe_free(Vocab *v) {
    if (v) free(v->trie);
    free(v);
}

/* The tables stay owned by the caller and must outlive the returned handle. */
Vocab *inferd_bpe_new(const uint8_t *blob, const uint32_t *offsets, const uint32_t *sorted,
                      int64_t n_tokens, const uint64_t *merge_keys, const uint32_t *merge_ranks,
                      const uint32_t *merge_ids, int64_t n_merges, const uint8_t *special,
                      const int32_t *added_ids, int64_t n_added, int32_t unk_id) {
    Vocab *v = calloc(1, sizeof(Vocab));
    if (!v) return NULL;
    *v = (Vocab){blob, offsets, sorted, n_tokens, merge_keys, merge_ranks, merge_ids,
                 n_merges, special, unk_id, {0}, NULL, 1};
    int64_t capacity = 1;
    for (int64_t k = 0; k < n_added; k++)
        capacity += offsets[added_ids[k] + 1] - offsets[added_ids[k]];
    v->trie = malloc((size_t)capacity * sizeof(TrieNode));
    if (!v->trie) { free(v); return NULL; }
    v->trie[0] = (TrieNode){-1, -1, -1, 0, 0};
    for (int64_t k = 0; k < n_added; k++) {
        int32_t id = added_ids[k];
        int64_t node = 0;
        for (uint32_t i = offsets[id]; i < offsets[id + 1]; i++)
            node = trie_child(v, node, blob[i], 1);
        if (node > 0) { v->trie[node].token = id; v->trie[node].special = special[id]; }
    }
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        uint8_t name[6] = {'<', '0', 'x', (uint8_t)hex[b >> 4], (uint8_t)hex[b & 15], '>'};
        v->byte_ids[b] = (int32_t)inferd_bpe_lookup(v, name, 6);
    }
    return v;
}

/* The longest added token starting at text[pos] that `mode` matches: its id and end, or -1. */
static int32_t longest_added(const Vocab *v, const uint8_t *text, int64_t n, int64_t pos,
                             int mode, int64_t *end) {
    int32_t best = -1;
    int64_t node = 0;
    for (int64_t i = pos; i < n; i++) {
        node = trie_child((Vocab *)v, node, text[i], 0);
        if (node < 0) break;
        const TrieNode *t = &v->trie[node];
        if (t->token >= 0 && (mode != MATCH_SPECIAL_ONLY || t->special)) {
            best = t->token;
            *end = i + 1;
        }
    }
    return best;
}

static int64_t char_length(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

typedef struct { uint32_t rank; int32_t pos, id; } Merge;

static int merge_before(Merge a, Merge b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(Merge *heap, int64_t *size, Merge m) {
    int64_t i = (*size)++;
    while (i > 0 && merge_before(m, heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = m;
}

static Merge heap_pop(Merge *heap, int64_t *size) {
    Merge top = heap[0], last = heap[--*size];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *size) break;
        if (c + 1 < *size && merge_before(heap[c + 1], heap[c])) c++;
        if (!merge_before(heap[c], last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*size > 0) heap[i] = last;
    return top;
}

typedef struct { int32_t id, prev, next, alive; int64_t start, end; } Symbol;

static void push_pair(const Vocab *v, const Symbol *s, int32_t pos, Merge *heap, int64_t *size) {
    int64_t m = find_merge(v, (uint32_t)s[pos].id, (uint32_t)s[s[pos].next].id);
    if (m >= 0) heap_push(heap, size, (Merge){v->merge_ranks[m], pos, (int32_t)v->merge_ids[m]});
}

/* BPE over text[begin, end): appends its tokens; returns how many, or -1 without memory. */
static int64_t encode_word(const Vocab *v, const uint8_t *text, int64_t begin, int64_t end,
                           int32_t *ids, int64_t *starts, int64_t *ends) {
    int64_t n = end - begin; /* symbols: one per byte, but a space may become three */
    for (int64_t i = begin; i < end; i++) n += 2 * (text[i] == ' ');
    Symbol *s = malloc((size_t)n * sizeof(Symbol));
    Merge *heap = malloc((size_t)(3 * n) * sizeof(Merge));
    if (!s || !heap) { free(s); free(heap); return -1; }
    int64_t count = 0, unk_start = -1, unk_end = -1;
#define ADD(ID, START, END) s[count] = (Symbol){(ID), (int32_t)count - 1, (int32_t)count + 1, \
                                                1, (START), (END)}, count++
    for (int64_t i = begin; i < end;) {
        int64_t len = char_length(text[i]);
        if (i + len > end) len = end - i;
        static const uint8_t space[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
        const uint8_t *c = text[i] == ' ' ? space : text + i;
        int64_t clen = text[i] == ' ' ? 3 : len;
        int64_t id = inferd_bpe_lookup(v, c, clen);
        if (id >= 0) {
            if (unk_start >= 0) { ADD(v->unk_id, unk_start, unk_end); unk_start = -1; }
            ADD((int32_t)id, i, i + len);
        } else {
            int all_bytes = 1;
            for (int64_t b = 0; b < clen; b++) all_bytes &= v->byte_ids[c[b]] >= 0;
            if (all_bytes) {
                /* NOTE: as in HF, a pending unknown run is not closed here but after */
                for (int64_t b = 0; b < clen; b++) ADD(v->byte_ids[c[b]], i, i + len);
            } else if (v->unk_id >= 0) {
                if (unk_start < 0) unk_start = i;
                unk_end = i + len; /* consecutive unknown characters are one token */
            }
        }
        i += len;
    }
    if (unk_start >= 0) ADD(v->unk_id, unk_start, unk_end);
#undef ADD
    int64_t heap_size = 0;
    for (int32_t p = 0; p + 1 < count; p++) push_pair(v, s, p, heap, &heap_size);
    while (heap_size > 0) {
        Merge top = heap_pop(heap, &heap_size);
        Symbol *left = &s[top.pos];
        if (!left->alive || left->next >= count) continue;
        Symbol *right = &s[left->next];
        int64_t m = find_merge(v, (uint32_t)left->id, (uint32_t)right->id);
        if (m < 0 || (int32_t)v->merge_ids[m] != top.id) continue; /* stale */
        left->id = top.id;
        left->end = right->end;
        left->next = right->next;
        right->alive = 0;
        if (left->next < count) s[left->next].prev = top.pos;
        if (left->prev >= 0) push_pair(v, s, left->prev, heap, &heap_size);
        if (left->next < count) push_pair(v, s, top.pos, heap, &heap_size);
    }
    int64_t out = 0;
    for (int64_t p = 0; p < count; p++) {
        if (!s[p].alive) continue;
        ids[out] = s[p].id;
        starts[out] = s[p].start;
        ends[out] = s[p].end;
        out++;
    }
    free(s);
    free(heap);
    return out;
}

/* Tokens of text[0, n): ids and byte offsets, at most n + 2 * (spaces in it) of them.
   In MATCH_SPECIAL_ONLY mode the text between special tokens is one token of id -1 (only
   where the special tokens are matters there). Returns the count, or -1 without memory. */
int64_t inferd_bpe_encode(const Vocab *v, const uint8_t *text, int64_t n, int32_t mode,
                          int32_t *ids, int64_t *starts, int64_t *ends) {
    int64_t count = 0, piece = 0;
    for (int64_t pos = 0; pos <= n;) {
        int64_t match_end = 0;
        int32_t token = pos < n ? longest_added(v, text, n, pos, (int)mode, &match_end) : -1;
        if (pos < n && token < 0) { pos++; continue; }
        if (token >= 0 && mode == MATCH_KEEP_SPECIAL_TEXT && v->special[token]) {
            pos = match_end; /* matched, so nothing overlapping it matches, but kept as text */
            continue;
        }
        if (piece < pos) {
            if (mode == MATCH_SPECIAL_ONLY) {
                ids[count] = -1, starts[count] = piece, ends[count] = pos, count++;
            } else {
                int64_t k = encode_word(v, text, piece, pos, ids + count, starts + count,
                                        ends + count);
                if (k < 0) return -1;
                count += k;
            }
        }
        if (token < 0) break; /* pos == n */
        ids[count] = token, starts[count] = pos, ends[count] = match_end, count++;
        pos = piece = match_end;
    }
    return count;
}

/* Length of the valid UTF-8 sequence at s[0, n), or 0 (strict, as Python and Rust read it). */
static int64_t utf8_sequence(const uint8_t *s, int64_t n) {
    uint8_t b = s[0];
    if (b < 0x80) return 1;
    int64_t len = b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (int64_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (b == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
    if (b == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    if (b == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
    if (b == 0xF4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return len;
}

static int64_t flush_bytes(const uint8_t *run, int64_t n, uint8_t *out, int64_t at, int64_t cap) {
    int valid = 1;
    for (int64_t i = 0; i < n && valid;) {
        int64_t len = utf8_sequence(run + i, n - i);
        valid = len > 0;
        i += len;
    }
    if (valid) {
        if (at + n <= cap) memcpy(out + at, run, (size_t)n);
        return at + n;
    }
    for (int64_t i = 0; i < n; i++, at += 3) /* U+FFFD per byte */
        if (at + 3 <= cap) memcpy(out + at, "\xEF\xBF\xBD", 3);
    return at;
}

static int hex_digit(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The byte a "<0xNN>" token stands for, or -1 (read as Rust's u8::from_str_radix does,
   which also takes "+N"). */
static int byte_token(const uint8_t *t, int64_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
    if (t[3] == '+') return hex_digit(t[4]);
    int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* UTF-8 text of ids[0, n) into out[0, cap); returns its length (more than cap: call again
   with that much room), or -1 without memory. Ids outside the vocabulary are skipped, as
   HF does. */
int64_t inferd_bpe_decode(const Vocab *v, const int64_t *ids, int64_t n, int32_t skip_special,
                          uint8_t *out, int64_t cap) {
    uint8_t *run = NULL; /* the bytes of the current run of <0xNN> tokens */
    int64_t run_len = 0, run_cap = 0, at = 0;
    for (int64_t k = 0; k <= n; k++) {
        int byte = -1;
        const uint8_t *t = NULL;
        int64_t len = 0;
        if (k < n) {
            int64_t id = ids[k];
            if (id < 0 || id >= v->n_tokens || (skip_special && v->special[id])) continue;
            t = v->blob + v->offsets[id];
            len = v->offsets[id + 1] - v->offsets[id];
            /* U+2581 becomes a space before byte tokens are read; a token holding one cannot
               read as "<0xNN>" after that, and "<0xNN>" holds no 0xE2 byte. */
            byte = memchr(t, 0xE2, (size_t)len) ? -1 : byte_token(t, len);
        }
        if (byte >= 0) {
            if (run_len == run_cap) {
                run_cap = run_cap ? 2 * run_cap : 64;
                uint8_t *grown = realloc(run, (size_t)run_cap);
                if (!grown) { free(run); return -1; }
                run = grown;
            }
            run[run_len++] = (uint8_t)byte;
            continue;
        }
        if (run_len) { at = flush_bytes(run, run_len, out, at, cap); run_len = 0; }
        for (int64_t i = 0; i < len;) {
            int space = i + 3 <= len && t[i] == 0xE2 && t[i + 1] == 0x96 && t[i + 2] == 0x81;
            if (at < cap) out[at] = space ? ' ' : t[i];
            at++, i += space ? 3 : 1;
        }
    }
    free(run);
    return at;
}
