import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distattn.corpus import (Document, EmptyCorpusError, RaggedIds, RegexTokenizer, TextCorpus,
                             UnknownCorpusError, Vocabulary, available_corpora, get_corpus, tokenize_corpus)
from distattn.corpus.tokenize import tokenize_to_bytes, unicode_tokenizer


class ListCorpus:
    name = "list"

    def __init__(self, texts, labels=None, fail_after=None):
        self.texts, self.labels, self.fail_after = texts, labels, fail_after

    def fingerprint(self):
        return {"texts": self.texts}

    def __iter__(self):
        for i, t in enumerate(self.texts):
            if self.fail_after is not None and i >= self.fail_after:
                raise RuntimeError("interrupted")
            yield Document(t, label=self.labels[i] if self.labels else -1, split="all")


def test_seed_tokenizer():
    tok = RegexTokenizer()
    assert tok("I LOVED it!<br /><br />Didn't... 10/10") == ["i", "loved", "it", "didn't", "10", "10"]
    assert tok("") == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aZ09' <br/>!\u212aK\u00e9\u0130x\n")), max_size=40))
def test_bytes_fast_path_equals_str_path(text):
    tok = RegexTokenizer()
    assert tokenize_to_bytes(tok, text.encode("utf-8")) == [t.encode() for t in tok(text)]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aZ0 \t\n\x1c\x1d\x1e\x1f\x1b.")), max_size=30),
       st.sampled_from([r"\S+", r"[^\s.]+", r"\w+"]))
def test_bytes_fast_path_equals_str_path_for_whitespace_patterns(text, pattern):
    # str's \s also matches \x1c-\x1f (str.isspace()); the bytes fast path's \s did not, so a
    # .txt corpus (bytes) and the same text as .jsonl (str) were tokenized differently
    tok = RegexTokenizer(pattern=pattern)
    assert tokenize_to_bytes(tok, text.encode("utf-8")) == [t.encode() for t in tok(text)]


def test_a_whitespace_pattern_gets_a_new_cache_key_and_the_others_keep_theirs():
    # tokenized caches written before the fast-path fix above hold the old tokens for \s/\S
    # patterns; their key must differ. The default and the Unicode patterns are unaffected.
    for pattern in (r"\S+", r"[^\s.]+"):
        assert RegexTokenizer(pattern=pattern).config() == {"kind": "regex", "pattern": pattern, "lowercase": True,
                                                            "strip": ["<br />"], "separators": 2}
    for tok in (RegexTokenizer(), unicode_tokenizer(), RegexTokenizer(pattern=r"\w+")):
        assert "separators" not in tok.config()


@pytest.mark.parametrize("pattern", [r"[a-z\u00e0-\u00ff]+", r"(?:[a-z]|\N{LATIN SMALL LETTER E WITH ACUTE})+",
                                     r"(?u)[a-z\u00e9]+"])
def test_a_pattern_valid_only_as_str_is_accepted_and_used(pattern):
    # it was refused as "not a valid regular expression": its bytes copy (the ASCII fast path)
    # does not compile
    tok = RegexTokenizer(pattern=pattern)
    assert tok("Café au lait") == ["café", "au", "lait"]
    assert tokenize_to_bytes(tok, b"Cafe au lait") == [b"cafe", b"au", b"lait"]
    assert tokenize_to_bytes(tok, "Café".encode()) == ["café".encode()]
    with pytest.raises(ValueError, match="not a valid regular expression"):
        RegexTokenizer(pattern=r"[a-z")


def test_vocabulary_order_and_limits():
    v = Vocabulary.build([["b", "a", "c", "a", "b", "d"]], min_count=1)
    assert v.itos == ["<pad>", "<unk>", "a", "b", "c", "d"]        # count desc, ties alphabetical
    assert (v.pad_id, v.unk_id) == (0, 1)
    assert Vocabulary.build([["b", "a", "c", "a", "b"]], min_count=2).words == ["a", "b"]
    assert Vocabulary.build([["b", "a", "c", "a", "b"]], max_size=1).words == ["a"]
    assert list(v.encode(["a", "zzz", "d"])) == [2, 1, 5]
    assert list(v.encode(["a", "zzz"], oov="drop")) == [2]
    assert list(v.encode(["a", "zzz"], oov="negative")) == [2, -1]
    assert v.encode(["a"]).dtype == np.int32
    with pytest.raises(KeyError, match="zzz"):
        v.encode(["zzz"], oov="error")
    with pytest.raises(ValueError, match="oov='x' is not one of"):
        v.encode(["a"], oov="x")
    with pytest.raises(ValueError, match="min_count must be an integer >= 1, got 0"):
        Vocabulary.build([["a"]], min_count=0)
    with pytest.raises(ValueError, match="max_size must be None or an integer >= 1"):
        Vocabulary.build([["a"]], max_size=0)


def test_vocabulary_from_no_tokens_is_refused():
    """A generator consumed once already (a common slip) gave a vocabulary of specials alone."""
    docs = (d for d in [["a", "b"], ["b"]])
    assert Vocabulary.build(docs).words == ["b", "a"]
    with pytest.raises(ValueError, match=r"no tokens \(0 documents, an iterator already consumed"):
        Vocabulary.build(docs)
    with pytest.raises(ValueError, match=r"no tokens \(2 documents, all empty"):
        Vocabulary.build([[], []])


@pytest.mark.parametrize("bad", [4, 99, -2, np.int64(-7)])
def test_vocabulary_decode_refuses_an_id_out_of_range_naming_it_and_the_range(bad):
    """decode gave '<unk>' for any id outside the vocabulary (a caller's bug, e.g. ids of another
    vocabulary) without a word; -1, encode(oov="negative")'s out-of-vocabulary marker, still gives '<unk>'."""
    vocab = Vocabulary(["a", "b"])
    assert vocab.decode(vocab.encode(["a", "zz", "b"], oov="negative")) == ["a", "<unk>", "b"]
    with pytest.raises(IndexError, match=rf"ids\[2\] = {int(bad)} is not an id of this vocabulary; allowed: 0 to 3"):
        vocab.decode(np.array([2, 3, bad, 100]))


@pytest.mark.parametrize("ids, shown", [
    ([2, 1.7], "ids[1] = 1.7 is a float"), ([2, 3, True], "ids[2] = True is a bool"),
    # numpy's own repr and type name: np.float64(2.0), np.False_ and bool from numpy 2 on; 2.0, False and bool_ before
    (np.array([2.0, 3.0]), f"ids[0] = {np.float64(2.0)!r} is a {np.float64.__name__}"),
    (np.array([False, True]), f"ids[0] = {np.False_!r} is a {np.bool_.__name__}"),
    (["2"], "ids[0] = '2' is a str"),
])
def test_vocabulary_decode_refuses_ids_that_are_not_integers_naming_the_first(ids, shown):
    """int() truncated them: 1.7 decoded as id 1 ('<unk>'), True as 1, '2' as 2, without a word."""
    vocab = Vocabulary(["a", "b"])
    assert vocab.decode(np.array([2, 3, -1], dtype=np.int64)) == vocab.decode([np.int32(2), 3, -1]) == ["a", "b", "<unk>"]
    assert vocab.decode(np.array([3, 2], dtype=np.uint8)) == ["b", "a"]
    with pytest.raises(TypeError, match=re.escape(shown) + ", not an integer id"):
        vocab.decode(ids)


def test_vocabulary_json_roundtrip(tmp_path):
    v = Vocabulary.build([["x", "y", "x", "é"]])
    v.save(tmp_path / "v.json")
    assert Vocabulary.load(tmp_path / "v.json") == v
    assert not list(tmp_path.glob(".*part*"))
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a distattn vocabulary"):
        Vocabulary.load(tmp_path / "bad.json")


_VOCAB = {"format": "distattn.Vocabulary/1", "specials": ["<pad>", "<unk>"], "words": ["a", "b"], "counts": [3, 2]}


@pytest.mark.parametrize("change, message", [
    ({"counts": None}, "the field 'counts' is missing; expected a list of non-negative integers, one per word"),
    ({"words": None}, "the field 'words' is missing; expected a list of strings"),
    ({"specials": None}, "the field 'specials' is missing; expected a list of strings"),
    ({"words": "ab"}, "the field 'words' is a JSON string; expected a list of strings"),
    ({"specials": "<pad>"}, "the field 'specials' is a JSON string; expected a list of strings"),
    ({"counts": {"a": 3}}, "the field 'counts' is a JSON object; expected a list of non-negative integers"),
    ({"words": ["a", 7]}, "words[1] is 7 (a JSON integer); expected a list of strings"),
    ({"counts": [3, True]}, "counts[1] is True (a JSON boolean); expected a list of non-negative integers"),
    ({"counts": [3, 2.5]}, "counts[1] is 2.5 (a JSON number); expected a list of non-negative integers"),
    ({"counts": [3]}, "the field 'counts' has 1 entries but 'words' has 2; expected one count per word"),
    ({"words": ["a", "a"]}, "words[1] is 'a', already words[0]; expected each token once in 'specials' and 'words'"),
    ({"words": ["a", "<unk>"]}, "words[1] is '<unk>', already specials[1]; expected each token once"),
])
def test_vocabulary_load_of_a_malformed_file_is_a_value_error_naming_the_file_and_field(tmp_path, change, message):
    """A file without 'counts' raised a bare KeyError: 'counts'; ints as words and a JSON true as a
    count were read as a vocabulary (True counted 1)."""
    d = {k: v for k, v in {**_VOCAB, **change}.items() if v is not None}
    path = tmp_path / "v.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        Vocabulary.load(path)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        Vocabulary.from_dict(d)


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "not a distattn vocabulary file (a JSON array; expected an object with the fields 'format', "
               "'specials', 'words' and 'counts')"),
    (json.dumps(_VOCAB)[:40], "not a distattn vocabulary file: not valid JSON (Unterminated string"),
    ("", "not a distattn vocabulary file: not valid JSON (Expecting value: line 1 column 1)"),
])
def test_vocabulary_load_of_a_file_that_is_no_json_object_names_the_file(tmp_path, text, message):
    """A JSON array raised AttributeError: 'list' object has no attribute 'get'; a truncated file a
    JSONDecodeError that named no file."""
    path = tmp_path / "v.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        Vocabulary.load(path)
    assert Vocabulary.from_dict(_VOCAB).counts.tolist() == [0, 0, 3, 2]


def test_a_corpus_of_more_than_128_splits_keeps_each_documents_split(tmp_path):
    """Split codes were int8: the 129th split raised a bare OverflowError (numpy 1 wrapped it to -128,
    and selecting that split gave no document)."""
    from distattn.corpus.tokenized import TokenizedCorpus
    tc = tokenize_corpus([Document(f"w{i} x", split=f"s{i}") for i in range(300)], cache=False)
    tc.save(tmp_path / "entry")
    for tc in (tc, TokenizedCorpus.load(tmp_path / "entry")):
        assert [len(tc.split(f"s{i}")) for i in (0, 127, 128, 299)] == [1, 1, 1, 1]
        assert tc.split("s200").types[tc.split("s200").tokens.ids[0]] == "w200"
    small = tokenize_corpus([Document("a", split="x"), Document("b", split="y")], cache=False)
    assert small.docs.split_codes.dtype == np.int8


def test_ragged_ops():
    r = RaggedIds.from_sequences([[1, 2, 3], [], [4, 5], [6]])
    t = r.take([2, 0])
    assert list(t.ids) == [4, 5, 1, 2, 3] and list(t.offsets) == [0, 2, 5]
    assert list(r.truncate(1).ids) == [1, 4, 6]
    d = r.drop(r.ids % 2 == 0)
    assert [list(x) for x in d] == [[2], [], [4], [6]]
    with pytest.raises(ValueError, match="offsets must start at 0"):
        RaggedIds(np.array([1, 2]), np.array([0, 3]))


def test_ragged_map_refuses_ids_the_table_does_not_cover():
    # an OOV id (-1, from oov="negative") indexed the table from its end: it silently became the last entry
    r = RaggedIds.from_sequences([[-1, 2], [0]])
    with pytest.raises(ValueError, match=r"id -1 .*table of 3 entries"):
        r.map(np.array([10, 11, 12]))
    with pytest.raises(ValueError, match=r"id 2 .*table of 2 entries"):
        RaggedIds.from_sequences([[1, 2]]).map(np.array([10, 11]))
    assert [list(x) for x in RaggedIds.from_sequences([[2, 0], []]).map(np.array([10, 11, 12]))] == [[12, 10], []]


def test_ragged_reverse():
    r = RaggedIds.from_sequences([[1, 2, 3], [], [4, 5], [6]])
    back = r.reverse()
    assert [list(x) for x in back] == [[3, 2, 1], [], [5, 4], [6]]
    assert list(back.offsets) == list(r.offsets)
    assert np.array_equal(back.reverse().ids, r.ids)
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, rng.integers(0, 9)) for _ in range(40)]
    assert [list(x) for x in RaggedIds.from_sequences(docs).reverse()] == [list(d[::-1]) for d in docs]
    assert RaggedIds.from_sequences([]).reverse().n_tokens == 0


def test_tokenize_cache_roundtrip_and_reuse(tmp_path):
    corpus = ListCorpus(["the cat sat", "the dog", ""], labels=[1, 0, 1])
    tc = tokenize_corpus(corpus, cache=tmp_path)
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1 and (entries[0] / "meta.json").exists()
    again = tokenize_corpus(corpus, cache=tmp_path)
    assert again.types == tc.types and np.array_equal(again.tokens.ids, tc.tokens.ids)
    assert list(again.labels) == [1, 0, 1] and len(again) == 3
    vocab = tc.vocabulary()
    assert vocab.words[0] == "the"
    enc = tc.encode(vocab)
    assert [vocab.decode(d) for d in enc] == [["the", "cat", "sat"], ["the", "dog"], []]
    # another tokenizer config is another cache entry
    tokenize_corpus(corpus, tokenizer=RegexTokenizer(pattern=r"[a-z]+"), cache=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_regex_tokenizer_keeps_capitals_when_it_does_not_lowercase():
    assert RegexTokenizer(lowercase=False)("Hello World, it's") == ["Hello", "World", "it's"]   # once ['ello', 'orld', ...]
    assert RegexTokenizer()("Hello World") == ["hello", "world"]
    assert RegexTokenizer().config()["pattern"] == "[a-z0-9']+"          # the default's cache key is unchanged
    assert RegexTokenizer(pattern="[a-z]+", lowercase=False)("Hello") == ["ello"]   # an explicit pattern is kept


@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_regex_tokenizer_pattern_with_groups_keeps_whole_matches(as_bytes):
    """re.findall returns a pattern's groups, not its matches: [a-z]+('[a-z]+)? gave ['', "'t", ''] for
    "i don't know" (the group, mostly empty) and ([a-z']+)|([0-9]+) tuples, which tokenizing failed on."""
    def tokens(tokenizer, text):
        return [t.decode() for t in tokenize_to_bytes(tokenizer, text.encode() if as_bytes else text)]
    one, two = RegexTokenizer(pattern=r"[a-z]+('[a-z]+)?"), RegexTokenizer(pattern=r"([a-z']+)|([0-9]+)")
    assert tokens(one, "I don't KNOW 42") == ["i", "don't", "know"]
    assert tokens(two, "I don't KNOW 42") == ["i", "don't", "know", "42"]
    assert tokens(two, "Ça n'est 42") == ["a", "n'est", "42"]           # not ASCII: the str path
    # tokens cached under the old rule (the groups) are another entry than these
    assert one.config() != {**RegexTokenizer(pattern=r"[a-z]+(?:'[a-z]+)?").config(), "pattern": r"[a-z]+('[a-z]+)?"}


@pytest.mark.parametrize("pattern", [r"[a-z]*", r"\w*", r"(?:[a-z]+)?"])
def test_a_regex_tokenizer_pattern_that_matches_the_empty_string_is_refused(pattern):
    """[a-z]* gave an empty token at every character it did not match ('ab, cd' -> ['ab', '', '', 'cd',
    '']), and '' became the most frequent word of the vocabulary."""
    with pytest.raises(ValueError, match=re.escape(f"pattern={pattern!r} matches the empty string")):
        RegexTokenizer(pattern=pattern)


@pytest.mark.parametrize("label, shown", [(200, "200"), (-2, "-2"), ("pos", "'pos'"), (True, "True"), (1.5, "1.5")])
def test_document_labels_outside_int8_classes_are_refused_by_name(label, shown):
    """Labels are stored as int8: 200 once raised numpy's bare OverflowError."""
    with pytest.raises(ValueError, match=rf"document 1 has label {re.escape(shown)}; a label must be an integer "
                                         r"in \[-1, 127\]"):
        tokenize_corpus([Document("a b", label=0), Document("a b", label=label)], cache=False)
    with pytest.raises(ValueError, match=r"document 0 has rating 300"):
        tokenize_corpus([Document("a b", rating=300)], cache=False)
    tc = tokenize_corpus([Document("a b", label=1, rating=8), Document("c")], cache=False)
    assert tc.labels.tolist() == [1, -1]


def test_plain_function_tokenizers_are_never_served_from_the_cache(tmp_path):
    """Two lambdas share the name ``<lambda>``: keyed by name, the second got the first's tokens."""
    corpus = ListCorpus(["The Cat sat", "a dog"])
    first = tokenize_corpus(corpus, tokenizer=lambda s: s.split(), cache=tmp_path)
    second = tokenize_corpus(corpus, tokenizer=lambda s: [s.upper()], cache=tmp_path)
    assert first.types == ["The", "Cat", "sat", "a", "dog"] and second.types == ["THE CAT SAT", "A DOG"]
    assert list(tmp_path.iterdir()) == []          # nothing written that a later call could misread


def test_interrupted_tokenization_leaves_no_cache(tmp_path):
    with pytest.raises(RuntimeError, match="interrupted"):
        tokenize_corpus(ListCorpus(["a b"] * 10, fail_after=5), cache=tmp_path)
    assert not any(tmp_path.iterdir()) if tmp_path.exists() else True


def test_damaged_cache_is_rebuilt(tmp_path):
    corpus = ListCorpus(["a b c", "c d"])
    tc = tokenize_corpus(corpus, cache=tmp_path)
    entry = next(tmp_path.iterdir())
    (entry / "types.json").write_text("{broken")
    again = tokenize_corpus(corpus, cache=tmp_path)
    assert again.types == tc.types
    assert json.loads((entry / "types.json").read_text()) is not None   # the entry was written anew
    assert tokenize_corpus(corpus, cache=tmp_path).types == tc.types     # and reads back


@pytest.mark.parametrize("name", ["ids.npy", "offsets.npy", "labels.npy", "type_counts.npy"])
def test_a_cache_file_left_empty_is_rebuilt(tmp_path, name):
    """np.load raises EOFError, not OSError/ValueError, for a file of zero bytes: the damaged entry
    stopped tokenize_corpus instead of being rebuilt."""
    corpus = ListCorpus(["a b c", "c d"], labels=[1, 0])
    tc = tokenize_corpus(corpus, cache=tmp_path)
    entry = next(tmp_path.iterdir())
    (entry / name).unlink()                  # not truncated in place: tc maps ids.npy
    (entry / name).write_bytes(b"")
    again = tokenize_corpus(corpus, cache=tmp_path)
    assert again.types == tc.types and np.array_equal(again.tokens.ids, tc.tokens.ids)
    assert np.array_equal(again.tokens.offsets, tc.tokens.offsets) and again.labels.tolist() == [1, 0]
    assert (entry / name).stat().st_size > 0          # the entry was written anew


@pytest.mark.parametrize("name", ["ids.npy", "type_counts.npy", "labels.npy", "split_codes.npy", "types.json"])
def test_a_cache_file_with_a_flipped_bit_is_rebuilt_not_used(tmp_path, caplog, name):
    """A bit flipped on disk in the last byte of a file (a token id, a count, a label, a word) left
    every file readable, and the wrong tokens, labels or words were served without a word."""
    corpus = ListCorpus(["a b c", "c d"], labels=[1, 0])
    tc = tokenize_corpus(corpus, cache=tmp_path)
    entry = next(tmp_path.iterdir())
    data = bytearray((entry / name).read_bytes())
    data[-2 if name == "types.json" else -1] ^= 0x01        # types.json: a letter of the last word, not its quote
    (entry / name).unlink()                  # not changed in place: tc maps ids.npy
    (entry / name).write_bytes(bytes(data))
    again = tokenize_corpus(corpus, cache=tmp_path)
    assert f"ignoring damaged tokenized cache {entry}" in caplog.text and name in caplog.text
    assert again.types == tc.types and np.array_equal(again.tokens.ids, tc.tokens.ids)
    assert again.type_counts.tolist() == tc.type_counts.tolist() and again.labels.tolist() == [1, 0]
    assert again.docs.split_codes.tolist() == tc.docs.split_codes.tolist()
    assert (entry / name).read_bytes() != bytes(data)          # the entry was written anew


def test_a_cache_meta_json_changed_into_other_valid_json_is_rebuilt_not_used(tmp_path, caplog):
    """meta.json with a letter of a split name changed on disk is still valid JSON, and its files'
    digests still match: the entry was served with a split no name selects. Its seal refuses it."""
    corpus = ListCorpus(["a b c", "c d"], labels=[1, 0])
    tc = tokenize_corpus(corpus, cache=tmp_path)
    entry = next(tmp_path.iterdir())
    text = (entry / "meta.json").read_text(encoding="utf-8")
    assert '"split_names": ["all"]' in text
    (entry / "meta.json").write_text(text.replace('"split_names": ["all"]', '"split_names": ["alm"]'),
                                     encoding="utf-8")
    again = tokenize_corpus(corpus, cache=tmp_path)
    assert f"ignoring damaged tokenized cache {entry}" in caplog.text and "meta.json is damaged" in caplog.text
    assert again.docs.split_names == tc.docs.split_names == ["all"]
    assert '"split_names": ["all"]' in (entry / "meta.json").read_text(encoding="utf-8")     # written anew


def test_an_entry_another_process_wrote_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes tokenizing one corpus: the second to finish removed the first's entry before its
    rename, pulling it from under the first's load. The entry written first is kept now (the same
    tokens), and the late copy discarded."""
    import distattn.corpus.tokenized as tokenized
    corpus = ListCorpus(["a b c", "c d"])
    real, first = tokenized._tokenize, []

    def racing(*args, **kw):            # "another process" writes the entry while this one tokenizes
        monkeypatch.setattr(tokenized, "_tokenize", real)
        first.append(tokenize_corpus(corpus, cache=tmp_path))
        (next(tmp_path.iterdir()) / "written-first").write_text("")      # marks that process's entry
        return real(*args, **kw)

    monkeypatch.setattr(tokenized, "_tokenize", racing)
    tc = tokenize_corpus(corpus, cache=tmp_path)
    (entry,) = list(tmp_path.iterdir())                  # no temporary directory left beside it
    assert (entry / "written-first").exists()
    assert tc.types == first[0].types and np.array_equal(tc.tokens.ids, first[0].tokens.ids)


def test_an_entry_without_meta_json_is_rebuilt(tmp_path):
    corpus = ListCorpus(["a b c", "c d"])
    tokenize_corpus(corpus, cache=tmp_path)
    entry = next(tmp_path.iterdir())
    (entry / "meta.json").unlink()
    assert tokenize_corpus(corpus, cache=tmp_path).tokens.n_tokens == 5
    assert (entry / "meta.json").exists()


def test_empty_corpus_errors(tmp_path):
    with pytest.raises(EmptyCorpusError, match="no documents"):
        tokenize_corpus(ListCorpus([]), cache=False)
    with pytest.raises(EmptyCorpusError, match="no tokens"):
        tokenize_corpus(ListCorpus(["", "!!!"]), cache=False)


def test_text_corpus_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first doc here\nsecond doc\n")
    tc = tokenize_corpus(TextCorpus(tmp_path / "a.txt"), cache=False)
    assert len(tc) == 2 and tc.n_tokens == 5
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "x.txt").write_text("one two")
    (d / "sub" / "y.txt").write_text("three")
    (d / "ignored.md").write_text("nope")
    assert tokenize_corpus(TextCorpus(d), cache=False).n_tokens == 3
    j = tmp_path / "c.jsonl"
    j.write_text('{"text": "good film", "label": 1}\n\n{"text": "bad film"}\n')
    tc = tokenize_corpus(TextCorpus(j), cache=False)
    assert list(tc.labels) == [1, -1]


def test_text_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextCorpus(tmp_path / "missing.txt")
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match=r"unsupported text corpus .* \(suffix '.csv'\)"):
        TextCorpus(tmp_path / "x.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="contains no .txt files"):
        TextCorpus(tmp_path / "empty")
    j = tmp_path / "bad.jsonl"
    j.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .* 'text' field"):
        list(TextCorpus(j))
    j.write_text('{"text": "ok", "label": "pos"}\n')
    with pytest.raises(ValueError, match="'label' must be an integer"):
        list(TextCorpus(j))


def test_a_jsonl_text_with_an_unpaired_surrogate_is_refused_by_line(tmp_path):
    # JSON's "\ud800" escape decodes to a lone surrogate: the default tokenizer dropped it silently and
    # the whitespace tokenizer failed with a UnicodeEncodeError that named no file or line
    j = tmp_path / "s.jsonl"
    j.write_text('{"text": "a pair \\ud83d\\ude00 is fine"}\n{"text": "half \\ud800 is not"}\n')
    with pytest.raises(ValueError, match=r"s.jsonl:2: 'text' holds an unpaired UTF-16 surrogate \(U\+D800\)"):
        list(TextCorpus(j))
    j.write_text('{"text": "a pair \\ud83d\\ude00 is fine"}\n')
    assert [d.text for d in TextCorpus(j)] == ["a pair \U0001F600 is fine"]


def test_a_jsonl_split_must_be_a_string(tmp_path):
    # a null split became the split 'None' and a number the split '3', without a word
    j = tmp_path / "s.jsonl"
    j.write_text('{"text": "a", "split": "train"}\n{"text": "b", "split": null}\n{"text": "c"}\n')
    assert [d.split for d in TextCorpus(j)] == ["train", "all", "all"]      # null: absent, as for 'label'
    assert TextCorpus(j).fingerprint()["reader"] >= 3      # tokens cached with the split 'None' are not reused
    j.write_text('{"text": "a", "split": "train"}\n{"text": "b", "split": 3}\n')
    with pytest.raises(ValueError, match=r"s.jsonl:2: 'split' must be a string, got 3"):
        list(TextCorpus(j))


@pytest.mark.parametrize("key, line", [("text", '{"text": "a", "text": "b"}'),
                                       ("label", '{"text": "a", "label": 0, "label": 1}'),
                                       ("split", '{"split": "train", "text": "a", "split": "test"}')])
def test_a_jsonl_field_given_twice_is_refused_naming_file_line_and_key(tmp_path, key, line):
    """json.loads keeps the last of two equal keys: {"text": "a", "text": "b"} was read as "b" without a word."""
    j = tmp_path / "d.jsonl"
    j.write_text('{"text": "fine", "meta": {"x": 1}}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"d.jsonl:2: the key '{key}' appears more than once"):
        list(TextCorpus(j))
    j.write_text('{"text": "fine", "meta": {"x": 1, "x": 2}, "other": 1, "other": 2}\n')   # keys not read: as before
    assert [d.text for d in TextCorpus(j)] == ["fine"]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_empty_and_blank_records_are_documents_without_tokens_and_blank_jsonl_lines_are_skipped(tmp_path, encoding):
    """The rule the module docstring and the README state, the same in every encoding: a .txt line,
    a directory's file and a .jsonl object are each a document, even without text."""
    t = tmp_path / "a.txt"
    t.write_bytes("the cat\n\n  \r\nthe dog\n".encode(encoding))
    assert [(d.name, len(tokenize_to_bytes(unicode_tokenizer(), d.text))) for d in TextCorpus(t, encoding)] == \
        [("line1", 2), ("line2", 0), ("line3", 0), ("line4", 2)]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes("the cat".encode(encoding))
    (tmp_path / "d" / "b.txt").write_bytes(b"")
    assert [d.name for d in TextCorpus(tmp_path / "d", encoding)] == ["a.txt", "b.txt"]
    j = tmp_path / "a.jsonl"
    j.write_bytes('{"text": "the cat"}\n\n  \n{"text": ""}\n{"text": " "}\n'.encode(encoding))
    assert [d.name for d in TextCorpus(j, encoding)] == ["line1", "line4", "line5"]
    tc = tokenize_corpus(TextCorpus(t, encoding), cache=False)
    assert len(tc) == 4 and tc.n_tokens == 4


def test_registry():
    names = available_corpora()
    assert {"imdb", "text", "paper"} <= set(names)
    with pytest.raises(UnknownCorpusError, match="unknown corpus 'imbd'; valid names: imdb, paper, text"):
        get_corpus("imbd")


def test_seed_literal_tokenizer_is_the_printed_code():
    from distattn.corpus import SeedLiteralTokenizer, tokenize_corpus
    tok = SeedLiteralTokenizer()
    # only the first character is cleaned (the printed regex is anchored); punctuation stays attached
    assert tok('"Great!" film.<br /><br />I LOVED it, truly... 10/10') == \
        ['great!"', 'film.', 'i', 'loved', 'it,', 'truly...', '10/10']
    assert tok("  ...and") == ["...and"] and tok("...and") == ["..and"]
    assert tok.config() != RegexTokenizer().config()
    tc = tokenize_corpus([Document("Bad, bad film!"), Document("<br />Good film.")], tokenizer=tok, cache=None)
    vocab = tc.vocabulary()
    enc = tc.encode(vocab)
    docs = [[vocab.itos[i] for i in enc.tokens.ids[a:b]] for a, b in zip(enc.tokens.offsets[:-1], enc.tokens.offsets[1:])]
    assert docs == [["bad,", "bad", "film!"], ["good", "film."]]


@pytest.mark.parametrize("make, message", [
    (lambda: RaggedIds.from_sequences([[0.5, 1.7]]), "document 0 has dtype float64; allowed: integer token ids"),
    (lambda: RaggedIds.from_sequences([[1, 2], [True, False]]), "document 1 has dtype bool"),
    (lambda: RaggedIds.from_sequences([[[0, 1], [1, 2]]]), r"document 0 must be a 1-D sequence .*shape \(2, 2\)"),
    (lambda: RaggedIds.from_sequences([[1], np.array([3, 2**64 - 1], dtype=np.uint64)]),   # once -1 (OOV)
     "document 1 holds token id 18446744073709551615, beyond int64"),
    (lambda: RaggedIds(np.array([np.nan, 1.0]), [0, 2]), "ids has dtype float64"),
    (lambda: RaggedIds(np.array([1, 1]), [0, 1.5, 2]), "offsets has dtype float64; allowed: integer positions"),
    (lambda: RaggedIds.from_sequences([[1], [2], [3]]).take([0.9, 2.5]),   # once documents 0 and 2
     "document indices have dtype float64; allowed: integer indices or a boolean mask"),
    (lambda: RaggedIds.from_sequences([[1], [2], [3]]).take([[0, 1]]),   # once "object too deep for desired array"
     r"document indices must be 1-D \(r\[i\] for one document\); got shape \(1, 2\)"),
    (lambda: RaggedIds.from_sequences([[1], [2], [3]]).take(np.int64(1)),   # once "len() of unsized object"
     r"document indices must be 1-D \(r\[i\] for one document\); got shape \(\)"),
    (lambda: Vocabulary("abc"), "words='abc' is a string"),
    (lambda: Vocabulary(["a"]).encode("the movie"), "tokens='the movie' is a string"),
    (lambda: Vocabulary.build(["the movie", "good"]), r"documents\[0\]='the movie' is a string"),
    (lambda: tokenize_corpus("hello world", cache=False), "corpus='hello world' is a string"),
    (lambda: RegexTokenizer(strip="<br />"), r"strip='<br />' is a string; allowed: a tuple of strings"),
])
def test_ids_and_tokens_of_the_wrong_kind_are_refused_not_coerced(make, message):
    """Floats were truncated to ids, bools read as 0/1, and a string iterated as characters."""
    with pytest.raises(TypeError if "dtype" in message or "string" in message else ValueError, match=message):
        make()


def test_get_corpus_refuses_unknown_options_and_text_honours_its_encoding(tmp_path):
    with pytest.raises(TypeError, match=r"get_corpus\('imdb'\) got unknown option\(s\) \['splt'\]; allowed: split"):
        get_corpus("imdb", splt="train")                     # a typo was silently ignored
    path = tmp_path / "latin.txt"
    path.write_bytes("café au lait\nna\xefve\n".encode("latin-1"))
    docs = list(get_corpus("text", path=str(path), encoding="latin-1"))
    assert [d.text.decode() if isinstance(d.text, bytes) else d.text for d in docs] == ["café au lait", "naïve"]
    assert get_corpus("text", path=str(path), encoding="latin-1").fingerprint() != \
        get_corpus("text", path=str(path)).fingerprint()       # another encoding, another cache entry
    with pytest.raises(ValueError, match="encoding='no-such-codec' is not a codec"):
        get_corpus("text", path=str(path), encoding="no-such-codec")


@pytest.mark.parametrize("layout", ["txt", "jsonl", "dir"])
def test_bytes_that_are_not_utf8_are_an_error_naming_file_and_line(tmp_path, layout):
    """Once silently replaced by U+FFFD in .txt ("café" became "caf"), and a bare codec error
    without file or line in .jsonl."""
    bad = "café".encode("latin-1")
    if layout == "txt":
        path, where = tmp_path / "c.txt", "c.txt:2"
        path.write_bytes(b"fine line\n" + bad + b" au lait\n")
    elif layout == "jsonl":
        path, where = tmp_path / "c.jsonl", "c.jsonl:2"
        path.write_bytes(b'{"text": "fine"}\n{"text": "' + bad + b'"}\n')
    else:
        path, where = tmp_path / "d", "b.txt"
        path.mkdir()
        (path / "a.txt").write_text("fine")
        (path / "b.txt").write_bytes(bad)
    with pytest.raises(ValueError, match=rf"{re.escape(where)}: not UTF-8 \(byte 0xe9 at byte \d+\); re-encode"):
        list(get_corpus("text", path=str(path)))
    texts = [d.text if isinstance(d.text, bytes) else d.text.encode()
             for d in get_corpus("text", path=str(_utf8_copy(path, tmp_path)))]
    assert any("café".encode() in t for t in texts)            # the same text as UTF-8 passes


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1", "utf-16"])
def test_txt_lines_end_at_newline_in_every_encoding(tmp_path, encoding):
    """A .txt corpus once split an old-Mac (CR-only) file into lines when an encoding was given
    (universal newlines) and read it as one document in UTF-8: the document count depended on the
    encoding. Now lines end at \\n (or \\r\\n) in every encoding, and a CR inside a line warns."""
    def texts(name, raw):
        path = tmp_path / name
        path.write_bytes(raw.encode(encoding))
        return [d.text.decode() if isinstance(d.text, bytes) else d.text
                for d in get_corpus("text", path=str(path), encoding=encoding)]

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # \n and \r\n endings: no warning
        assert texts("lf.txt", "one café\ntwo\n") == ["one café", "two"]
        assert texts("crlf.txt", "one café\r\ntwo\r\n") == ["one café", "two"]
    with pytest.warns(UserWarning, match=r"cr.txt:1: a carriage return \(\\r\) inside a line.*tr '\\r' '\\n'") as rec:
        assert texts("cr.txt", "one café\rtwo\rthree\r") == ["one café\rtwo\rthree"]
    assert len(rec) == 1


def test_bytes_that_do_not_decode_in_a_declared_encoding_are_an_error_too(tmp_path):
    """Once replaced by U+FFFD in silence, as UTF-8 input was."""
    path = tmp_path / "c.txt"
    path.write_bytes("first line\n".encode("utf-16") + b"\x00\xd8")    # a lone surrogate half at the end
    with pytest.raises(ValueError, match=r"c.txt: not valid utf-16 after line 1 .*encoding="):
        list(get_corpus("text", path=str(path), encoding="utf-16"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"\xff\xfe\x00\xd8")
    with pytest.raises(ValueError, match=r"a.txt: not valid utf-16"):
        list(get_corpus("text", path=str(tmp_path / "d"), encoding="utf-16"))


def _utf8_copy(path, tmp_path):
    out = tmp_path / ("utf8" + path.suffix) if path.is_file() else tmp_path / "utf8dir"
    if path.is_file():
        out.write_bytes(path.read_bytes().decode("latin-1").encode("utf-8"))
    else:
        out.mkdir()
        for f in path.iterdir():
            (out / f.name).write_bytes(f.read_bytes().decode("latin-1").encode("utf-8"))
    return out


def test_sha256_file_refuses_an_empty_read_size(tmp_path):
    from distattn.corpus.download import sha256_file
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert sha256_file(f, chunk=1) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with pytest.raises(ValueError, match="chunk=0 is invalid; allowed: an integer >= 1"):
        sha256_file(f, chunk=0)                             # gave the empty file's hash


def test_register_corpus_refuses_a_factory_that_cannot_be_called():
    from distattn.corpus import register_corpus
    with pytest.raises(TypeError, match="factory must be callable"):
        register_corpus("x", 3)
    assert "x" not in available_corpora()


def test_subsets_need_a_full_mask_or_integer_indices():
    tc = tokenize_corpus(["a b", "c d", "e"], cache=False)
    with pytest.raises(ValueError, match=r"one entry per document \(3\); got shape \(1,\)"):
        tc.take([True])                                        # once quietly one document
    with pytest.raises(TypeError, match="integer indices or a boolean mask"):
        tc.take([0.5])
    assert len(tc.take([True, False, True])) == 2 and len(tc.take([2, 0])) == 2


def test_a_utf16_text_file_is_split_into_lines_after_decoding(tmp_path):
    path = tmp_path / "wide.txt"
    path.write_bytes("first line\nsecond café\n".encode("utf-16"))
    docs = list(get_corpus("text", path=str(path), encoding="utf-16"))
    assert [d.text.decode() for d in docs] == ["first line", "second café"]   # once mojibake and a third line



def test_unsigned_and_signed_ids_concatenate_as_integers():
    assert RaggedIds.from_sequences([np.array([1], np.uint64), [2]]).ids.tolist() == [1, 2]
    assert RaggedIds.from_sequences([[], np.array([], np.int32), [3, 4]]).offsets.tolist() == [0, 0, 0, 2]


def test_a_non_ascii_strip_string_does_not_break_ascii_documents(tmp_path):
    """The bytes fast path encoded every strip string as ASCII: RegexTokenizer(strip=("—",)) raised
    UnicodeEncodeError on every ASCII line of a text corpus."""
    path = tmp_path / "c.txt"
    path.write_text("plain ascii line\ncaf\u00e9\u2014au lait\n", encoding="utf-8")
    tok = RegexTokenizer(strip=("<br />", "\u2014"))
    tc = tokenize_corpus(get_corpus("text", path=path), tokenizer=tok, cache=False)
    assert tc.types == ["plain", "ascii", "line", "caf", "au", "lait"]
    assert tokenize_to_bytes(tok, b"a<br />b") == [b"a", b"b"]


def test_a_tokenizer_subclass_that_overrides_call_is_used_and_cached_apart(tmp_path):
    """A RegexTokenizer subclass overriding __call__ (e.g. stemming) was bypassed by the bytes fast
    path on text corpora, and shared the base class's cache key, so it got the plain tokens."""
    class Stem(RegexTokenizer):
        def __call__(self, text):
            return [t.rstrip("s") for t in super().__call__(text)]

    path = tmp_path / "c.txt"
    path.write_text("cats dogs\nbirds\n", encoding="utf-8")
    assert tokenize_corpus(get_corpus("text", path=path), tokenizer=Stem(), cache=False).types == \
        ["cat", "dog", "bird"]
    plain = tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache")
    stemmed = tokenize_corpus(get_corpus("text", path=path), tokenizer=Stem(), cache=tmp_path / "cache")
    assert (plain.types, stemmed.types) == (["cats", "dogs", "birds"], ["cat", "dog", "bird"])
    assert "class" not in RegexTokenizer().config()                    # the base class keeps its cache key


@pytest.mark.parametrize("docs, tokenizer, message", [
    ([["the", "cat"], ["a", "dog"]], None, r"document 0 is list \['the', 'cat'\]; allowed: a str, UTF-8 bytes"),
    (["fine", None], None, "document 1 is NoneType None"),
    ([Document(["the", "cat"])], None, "document 0 is list"),
    (["the cat"], "whitespace", "tokenizer='whitespace' is not callable"),
    (["the cat"], lambda text: text.lower(), "returned a str, not a list of tokens"),
])
def test_tokenize_corpus_refuses_documents_and_tokenizers_of_the_wrong_kind(docs, tokenizer, message):
    """Pre-tokenized documents failed with AttributeError: 'list' object has no attribute 'lower',
    and a tokenizer returning a str was silently read as one token per character."""
    with pytest.raises(TypeError, match=message):
        tokenize_corpus(docs, tokenizer=tokenizer, cache=False)


@pytest.mark.parametrize("layout", ["txt", "dir"])
def test_a_rewritten_text_corpus_with_its_mtime_restored_is_not_served_from_the_cache(tmp_path, layout):
    """The text corpus fingerprint was (size, mtime): new content of the same size whose mtime was
    set back (cp -p, rsync -t, tar) returned the stale cached tokenization."""
    import os
    path = tmp_path / ("c.txt" if layout == "txt" else "docs")
    if layout == "dir":
        path.mkdir()
    file = path if layout == "txt" else path / "a.txt"
    file.write_text("alpha beta\n", encoding="utf-8")
    before = file.stat()
    first = tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache")
    assert first.types == ["alpha", "beta"]
    file.write_text("gamma zeta\n", encoding="utf-8")                     # same size
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))           # mtime as before
    again = tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache")
    assert again.types == ["gamma", "zeta"]
    assert tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache").types == ["gamma", "zeta"]


@pytest.mark.parametrize("layout", ["txt", "dir"])
def test_a_text_corpus_rewritten_within_the_timestamp_granularity_is_not_served_from_the_cache(
        tmp_path, monkeypatch, layout):
    """The fingerprint was (size, mtime, ctime), taken at once: on a file system with 2 s timestamps
    (FAT) a rewrite of the same size right after the first tokenization left all three as they were,
    and the stale cached tokens were served. Simulated: a clock that only sleep() moves, and a
    stat() that stamps each new content with that clock truncated to 2 s."""
    import os
    from pathlib import Path
    from types import SimpleNamespace

    from distattn.corpus import text
    clock = [1_700_000_000_500_000_000]                      # 0.5 s into a 2 s slot
    monkeypatch.setattr(text, "time", raising=False, value=SimpleNamespace(time_ns=lambda: clock[0],
                                                      sleep=lambda s: clock.__setitem__(0, clock[0] + int(s * 1e9))))
    path = tmp_path / ("c.txt" if layout == "txt" else "docs")
    if layout == "dir":
        path.mkdir()
    file = path if layout == "txt" else path / "a.txt"
    real_stat, seen = Path.stat, {}

    def fat_stat(self, *args, **kwargs):
        st = real_stat(self, *args, **kwargs)
        if self != file:
            return st
        content = self.read_bytes()
        if seen.get("content") != content:
            seen.update(content=content, stamp=clock[0] // 2_000_000_000 * 2_000_000_000)
        times = dict(st_atime_ns=seen["stamp"], st_mtime_ns=seen["stamp"], st_ctime_ns=seen["stamp"],
                     st_atime=seen["stamp"] / 1e9, st_mtime=seen["stamp"] / 1e9, st_ctime=seen["stamp"] / 1e9)
        return os.stat_result(tuple(st)[:7] + (seen["stamp"] // 10**9,) * 3, times)
    monkeypatch.setattr(Path, "stat", fat_stat)
    file.write_text("alpha beta\n", encoding="utf-8")
    first = tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache")
    assert first.types == ["alpha", "beta"]
    file.write_text("gamma zeta\n", encoding="utf-8")                     # same size, as soon as it could
    assert tokenize_corpus(get_corpus("text", path=path), cache=tmp_path / "cache").types == ["gamma", "zeta"]


@pytest.mark.parametrize("layout", ["txt", "dir"])
def test_the_fingerprint_of_a_text_corpus_is_the_same_just_written_and_settled(tmp_path, monkeypatch, layout):
    """A file just written is waited for, not hashed into the key: its fingerprint is the one it has
    later (a second compare run reuses every stage), and the one settled files always had, byte for
    byte (name, size, mtime_ns, ctime_ns), so existing cache entries stay valid."""
    import time
    from types import SimpleNamespace

    from distattn.atomic import config_hash
    from distattn.corpus import text
    path = tmp_path / ("c.txt" if layout == "txt" else "docs")
    if layout == "dir":
        path.mkdir()
    file = path if layout == "txt" else path / "a.txt"
    file.write_text("alpha beta\n", encoding="utf-8")
    fresh = TextCorpus(path).fingerprint()
    st = file.stat()
    later = time.time_ns() + 60 * 10**9
    monkeypatch.setattr(text, "time", raising=False, value=SimpleNamespace(time_ns=lambda: later,
                                                      sleep=lambda s: pytest.fail("a settled file was waited for")))
    settled = TextCorpus(path).fingerprint()
    before = {"corpus": "text", "reader": 2, "path": str(path.resolve()), "kind": layout,
              "files": [("a.txt" if layout == "dir" else "c.txt", st.st_size, st.st_mtime_ns, st.st_ctime_ns)]}
    assert fresh == settled == before
    assert config_hash(settled) == config_hash(before)


def test_a_text_corpus_stamped_in_the_future_is_hashed_not_waited_for(tmp_path, monkeypatch):
    """A file whose mtime is ahead of the clock (an archive from a machine whose clock is ahead) stays
    racy for longer than is worth waiting: its content goes into the fingerprint instead."""
    import hashlib
    import os
    import time

    from distattn.corpus import text
    file = tmp_path / "c.txt"
    file.write_text("alpha beta\n", encoding="utf-8")
    os.utime(file, ns=(time.time_ns(), time.time_ns() + 3600 * 10**9))
    monkeypatch.setattr(text.time, "sleep", lambda s: pytest.fail(f"waited {s} s"))
    entry = TextCorpus(file).fingerprint()["files"][0]
    assert entry[4] == hashlib.sha256(b"alpha beta\n").hexdigest()


def test_an_unwritable_tokenize_cache_is_refused_before_the_corpus_is_read(tmp_path):
    """cache= a path that cannot be a directory raised a bare FileExistsError naming the file, and
    only after the whole corpus had been tokenized."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    never_read = ListCorpus(["a b"], fail_after=0)                        # iterating it raises RuntimeError
    for cache in (not_a_dir, not_a_dir / "sub"):
        with pytest.raises(OSError, match=r"cache='.*file.*' is not a writable directory .*cache=False"):
            tokenize_corpus(never_read, cache=cache)
    good = tmp_path / "cache"
    tokenize_corpus(ListCorpus(["a b"]), cache=good)
    assert [p.name for p in good.iterdir() if p.name.startswith(".")] == []      # no probe file left


@pytest.mark.parametrize("make, error, message", [
    (lambda: Vocabulary.from_counts(["a", "b"], [1.9, 3]), ValueError, r"counts\[0\] is 1.9 \(float64\); allowed: non-neg"),
    (lambda: Vocabulary.from_counts(["a", "b"], [np.nan, 3]), ValueError, r"counts\[0\] is nan"),
    (lambda: Vocabulary.from_counts(["a", "b"], [2, -1]), ValueError, r"counts\[1\] is -1 \(int64\)"),
    (lambda: Vocabulary.from_counts(["a", "b"], [[1, 2]]), ValueError, r"counts has shape \(1, 2\), but there are 2 words"),
    (lambda: Vocabulary.from_counts("ab", [1, 2]), TypeError, r"words='ab' is a string"),
    (lambda: Vocabulary(["a"], [2.5]), ValueError, r"counts\[0\] is 2.5"),
    (lambda: Vocabulary(["a"], [-3]), ValueError, r"counts\[0\] is -3"),
    (lambda: Vocabulary.build([["a"]], max_size=True), ValueError, "max_size must be None or an integer >= 1, got True"),
    (lambda: Vocabulary.build([["a"]], min_count=True), ValueError, "min_count must be an integer >= 1, got True"),
])
def test_vocabulary_counts_and_limits_of_the_wrong_kind_are_refused(make, error, message):
    """Float counts were truncated (1.9 -> 1, changing min_count and the order), negative counts
    kept, NaN raised numpy's bare conversion error, a string of words an IndexError, and True
    was read as max_size=1."""
    with pytest.raises(error, match=message):
        make()
    assert Vocabulary.from_counts(["a", "b"], np.array([2.0, 3.0])).words == ["b", "a"]   # whole floats are counts


def test_truncate_and_sample_refuse_non_integer_sizes():
    """truncate(1.5) failed inside RaggedIds with 'offsets must start at 0, end at len(ids)...',
    and sample(1.5) with numpy's 'expected a sequence of integers'."""
    tc = tokenize_corpus(["the cat sat", "the dog", "a cat"], cache=False)
    enc = tc.encode(tc.vocabulary())
    with pytest.raises(ValueError, match=r"max_len must be an integer >= 0, got 1.5"):
        enc.truncate(1.5)
    with pytest.raises(ValueError, match=r"n must be an integer >= 0, got 1.5"):
        tc.sample(1.5)
    assert enc.truncate(np.int64(1)).n_tokens == 3 and len(tc.sample(2)) == 2


def test_a_corpus_of_ones_own_keeps_words_of_any_script(tmp_path):
    """The seed's ASCII pattern, once the default for every corpus, cut 'café' to 'caf' and 'été'
    to 't' in a text corpus, silently. A text corpus (or a plain list) now gets words of any script;
    IMDB keeps the seed's tokenizer, with which every IMDB figure was measured."""
    from distattn.corpus import ImdbCorpus, RegexTokenizer, TextCorpus, tokenize_corpus, unicode_tokenizer
    path = tmp_path / "fr.txt"
    path.write_text("Un café naïf, l'été à Zürich\nplain ascii words it's fine\n", encoding="utf-8")
    def words(tc, i):
        return [tc.types[t] for t in tc.tokens[i]]
    tc = tokenize_corpus(TextCorpus(path), cache=tmp_path / "cache")
    assert words(tc, 0) == ["un", "café", "naïf", "l'été", "à", "zürich"]
    assert words(tc, 1) == RegexTokenizer()("plain ascii words it's fine")     # ASCII: the same tokens
    assert words(tokenize_corpus(["Ça va"], cache=False), 0) == ["ça", "va"]
    assert TextCorpus(path).default_tokenizer().config() == unicode_tokenizer().config()
    assert ImdbCorpus.default_tokenizer(None).config() == RegexTokenizer().config()


@pytest.mark.parametrize("layout", ["txt", "dir", "jsonl"])
def test_a_bad_byte_after_a_byte_order_mark_is_reported_at_its_place_in_the_file(tmp_path, layout):
    """The BOM was dropped before the check, so the offset given was 3 bytes short (byte 4, not 7)."""
    raw = "\ufeff".encode("utf-8") + b"abc\xffdef"
    if layout == "txt":
        path, where = tmp_path / "a.txt", "a.txt:1"
        path.write_bytes(raw + b"\n")
    elif layout == "dir":
        path, where = tmp_path / "d", "b.txt"
        path.mkdir()
        (path / "b.txt").write_bytes(raw)
    else:
        path, where = tmp_path / "a.jsonl", "a.jsonl:1"
        path.write_bytes(raw + b"\n")
    with pytest.raises(ValueError, match=rf"{re.escape(where)}: not UTF-8 \(byte 0xff at byte 7\)"):
        list(TextCorpus(path))


@pytest.mark.parametrize("layout", ["txt", "dir", "jsonl"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_word(tmp_path, layout):
    """A UTF-8 BOM (Windows editors) stayed on the first word: WhitespaceTokenizer gave '\\ufeffthe',
    a type of its own beside 'the'; a .jsonl file with one was refused as invalid JSON."""
    from distattn.corpus import WhitespaceTokenizer
    bom = "\ufeff".encode("utf-8")
    if layout == "txt":
        path = tmp_path / "a.txt"
        path.write_bytes(bom + b"the cat\r\nthe dog\r\n")
    elif layout == "dir":
        path = tmp_path / "docs"
        (path / "sub").mkdir(parents=True)
        (path / "a.txt").write_bytes(bom + b"the cat")
        (path / "sub" / "b.txt").write_bytes(bom + b"the dog")
    else:
        path = tmp_path / "a.jsonl"
        path.write_bytes(bom + b'{"text": "the cat", "label": 1}\r\n{"text": "the dog"}\n')
    corpus = TextCorpus(path)
    tc = tokenize_corpus(corpus, tokenizer=WhitespaceTokenizer(), cache=tmp_path / "cache")
    assert sorted(tc.types) == ["cat", "dog", "the"] and tc.vocabulary().counts[2] == 2
    # tokens cached before the BOM was dropped (reader 1, no "reader" key) are another entry than these
    assert corpus.fingerprint()["reader"] >= 2


@pytest.mark.parametrize("layout", ["txt", "dir", "jsonl"])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                                      "utf-32-le", "utf-32-be"])
def test_a_byte_order_mark_is_not_part_of_the_first_word_in_any_declared_encoding(tmp_path, layout, encoding):
    """With utf-16-le/-be and utf-32-le/-be (codecs that keep U+FEFF) the mark stayed on the first
    word ('\ufeffthe' beside 'the'), and a .jsonl file was refused as invalid JSON."""
    from distattn.corpus import WhitespaceTokenizer
    bom = "" if encoding in ("utf-16", "utf-32", "utf-8-sig") else "\ufeff"    # those write one themselves
    text = '{"text": "the cat"}\n{"text": "the dog"}\n' if layout == "jsonl" else "the cat\nthe dog\n"
    raw = (bom + text).encode(encoding)
    if layout == "dir":
        path = tmp_path / "docs"
        path.mkdir()
        (path / "a.txt").write_bytes(raw)
        (path / "b.txt").write_bytes(raw)
    else:
        path = tmp_path / f"a.{layout}"
        path.write_bytes(raw)
    corpus = TextCorpus(path, encoding=encoding)
    tc = tokenize_corpus(corpus, tokenizer=WhitespaceTokenizer(), cache=tmp_path / "cache")
    assert sorted(tc.types) == ["cat", "dog", "the"]
    # tokens cached with the mark on the first word are another entry than these
    assert encoding == "utf-8" or corpus.fingerprint()["bom"] == "dropped"


def test_a_directory_corpus_reads_txt_files_whatever_the_case_of_their_suffix(tmp_path):
    """A single B.TXT is a .txt corpus, but rglob("*.txt") left it out of a directory silently."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "B.TXT").write_text("beta")
    (tmp_path / "c.Txt").write_text("gamma")
    (tmp_path / "d.csv").write_text("not read")
    assert [d.text for d in TextCorpus(tmp_path)] == [b"alpha", b"gamma", b"beta"]
    assert [d.text for d in TextCorpus(tmp_path / "sub" / "B.TXT")] == [b"beta"]


def test_ragged_ids_slice_gives_the_documents_and_other_indices_are_named():
    """r[1:3] failed with "'<=' not supported between instances of 'int' and 'slice'"."""
    r = RaggedIds.from_sequences([[1, 2], [3], [], [4, 5, 6]])
    part = r[1:]
    assert isinstance(part, RaggedIds) and [d.tolist() for d in part] == [[3], [], [4, 5, 6]]
    assert [d.tolist() for d in r[::-2]] == [[4, 5, 6], [3]]
    assert r[np.int64(3)].tolist() == [4, 5, 6] and r[-1].tolist() == [4, 5, 6]
    for bad in (1.0, "0", True):
        with pytest.raises(TypeError, match="integers or slices"):
            r[bad]


def test_a_directory_corpus_skips_hidden_files_and_directories_below_its_root(tmp_path):
    """rglob("*") read editor temporaries (.#notes.txt), .ipynb_checkpoints/ and .git/ copies as
    documents of their own; the root itself may sit under a hidden directory."""
    root = tmp_path / ".data" / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.txt").write_text("beta")
    (root / ".#a.txt").write_text("alpha draft")
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("alpha again")
    (root / "sub" / ".git" / "x").mkdir(parents=True)
    (root / "sub" / ".git" / "x" / "c.txt").write_text("gamma")
    corpus = TextCorpus(root)
    assert [(d.name, d.text) for d in corpus] == [("a.txt", b"alpha"), ("sub/b.txt", b"beta")]
    assert [f[0] for f in corpus.fingerprint()["files"]] == ["a.txt", "sub/b.txt"]
    (root / "a.txt").unlink()
    (root / "sub" / "b.txt").unlink()
    with pytest.raises(ValueError, match=r"contains no \.txt files.*hidden"):
        TextCorpus(root)


def test_a_directory_corpus_with_an_unreadable_subdirectory_is_refused_naming_it(tmp_path, monkeypatch):
    """rglob skips a directory it cannot list (mode 000, another user's) without an error, so its
    documents were left out of the corpus silently. (Listing is refused here through os.scandir,
    as root may list any directory whatever its mode.) An unreadable hidden directory holds no
    documents and is no error."""
    import os
    (tmp_path / "locked").mkdir()
    (tmp_path / ".cache").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "locked" / "b.txt").write_text("beta")
    scandir = os.scandir

    def refusing(path="."):
        if os.path.basename(os.fspath(path)) in ("locked", ".cache"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(ValueError, match=re.escape(f"cannot list directory {str(tmp_path / 'locked')!r}")
                       + r".*Permission denied"):
        TextCorpus(tmp_path)
    (tmp_path / "locked" / "b.txt").rename(tmp_path / "b.txt")
    (tmp_path / "locked").rmdir()
    assert [d.name for d in TextCorpus(tmp_path)] == ["a.txt", "b.txt"]


@pytest.mark.parametrize("split", ["train+unsup", "", " train", "train "])
def test_a_jsonl_split_that_could_never_be_selected_is_refused_naming_file_line_and_value(tmp_path, split):
    """tc.split(...) parses 'a+b' as two splits, refuses '' and strips spaces: a document whose
    split was one of these was read and then could not be selected by any name."""
    j = tmp_path / "s.jsonl"
    j.write_text('{"text": "a", "split": "train"}\n' + json.dumps({"text": "b", "split": split}) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"s.jsonl:2: 'split' {split!r} could never be selected")
                       + r".*allowed: a non-empty name without '\+'"):
        list(TextCorpus(j))
    j.write_text('{"text": "a b", "split": "train"}\n{"text": "c", "split": "dev-2"}\n')
    tc = tokenize_corpus(TextCorpus(j), cache=False)
    assert tc.docs.split_names == ["train", "dev-2"] and len(tc.split("dev-2")) == 1


def test_vocabulary_ties_between_words_that_differ_by_trailing_nuls_are_alphabetical(tmp_path):
    """numpy's fixed-width str drops trailing NULs, so "a" and "a\\x00" sorted as equal and a tie
    between them kept first-seen order; split() keeps NUL inside a token, so a text file can hold both."""
    assert Vocabulary.build([["a\x00", "a", "a\x00\x00"]]).words == ["a", "a\x00", "a\x00\x00"]
    from distattn.corpus.tokenize import WhitespaceTokenizer
    path = tmp_path / "nul.txt"
    path.write_bytes(b"b\x00 a\x00 a b\n")
    tc = tokenize_corpus(TextCorpus(path), tokenizer=WhitespaceTokenizer(), cache=False)
    assert tc.types == ["b\x00", "a\x00", "a", "b"]                    # first-seen order, all counted once
    assert tc.vocabulary().words == ["a", "a\x00", "b", "b\x00"]


def test_plain_string_documents_and_the_document_default_have_the_split_all():
    """The default split was '', which tc.split could never select (it refuses '' and knew no 'all')."""
    tc = tokenize_corpus(["a b", b"c", Document("d e")], cache=False)
    assert tc.docs.split_names == ["all"]
    assert len(tc.split("all")) == 3


@pytest.mark.parametrize("split", ["", "train+unsup", " train", "train ", 3])
def test_a_document_split_that_could_never_be_selected_is_refused_naming_the_document(split):
    docs = [Document("a b", split="train"), Document("c", split=split, name="d1")]
    what = "must be a string, got 3" if split == 3 else f"{split!r} could never be selected"
    with pytest.raises(ValueError, match=re.escape(f"document 1 ('d1'): 'split' {what}")):
        tokenize_corpus(docs, cache=False)
    if split != 3:
        with pytest.raises(ValueError, match=r"document 0: 'split' .*allowed: a non-empty name without '\+'"):
            tokenize_corpus([Document("c", split=split)], cache=False)


def test_a_document_split_of_none_is_the_split_all_as_a_jsonl_null(tmp_path):
    """A .jsonl line with "split": null was read as split 'all', while Document(text, split=None) (a
    missing value from the user's own pandas or JSON pipeline) was refused: one value, two behaviours."""
    j = tmp_path / "s.jsonl"
    j.write_text('{"text": "a b", "split": "train"}\n{"text": "c", "split": null}\n')
    from_jsonl = tokenize_corpus(TextCorpus(j), cache=False)
    from_documents = tokenize_corpus([Document("a b", split="train"), Document("c", split=None)], cache=False)
    assert from_documents.docs.split_names == from_jsonl.docs.split_names == ["train", "all"]
    assert from_documents.docs.split_codes.tolist() == from_jsonl.docs.split_codes.tolist() == [0, 1]
    assert len(from_documents.split("all")) == 1


def test_a_document_label_of_none_is_no_label_as_a_jsonl_null(tmp_path):
    """A .jsonl line with "label": null was read as NO_LABEL, while Document(text, label=None) was
    refused ("document 1 has label None"): one value, two behaviours."""
    j = tmp_path / "s.jsonl"
    j.write_text('{"text": "a b", "label": 1}\n{"text": "c", "label": null}\n')
    from_jsonl = tokenize_corpus(TextCorpus(j), cache=False)
    from_documents = tokenize_corpus([Document("a b", label=1), Document("c", label=None)], cache=False)
    assert from_documents.labels.tolist() == from_jsonl.labels.tolist() == [1, -1]


@pytest.mark.parametrize("encoding", ["hex", "base64", "rot13", "zlib"])
@pytest.mark.parametrize("name", ["c.txt", "c.jsonl", "d"])
def test_a_codec_that_is_no_text_encoding_is_refused_when_the_corpus_is_made(tmp_path, encoding, name):
    # codecs.lookup knows them, so the check passed; reading then raised a bare LookupError
    # ("'hex' is not a text encoding") from the first document, which no entry point reports
    path = tmp_path / name
    if name == "d":
        path.mkdir()
        (path / "a.txt").write_text("a b\n")
    else:
        path.write_text('{"text": "a b"}\n' if name.endswith(".jsonl") else "a b\n")
    with pytest.raises(ValueError, match=rf"encoding='{encoding}' is not a text encoding"):
        TextCorpus(path, encoding=encoding)


def test_a_file_just_written_beside_one_stamped_in_the_future_is_waited_for_not_hashed(tmp_path, monkeypatch):
    """One file stamped in the future (hashed: not worth waiting for) stopped the wait for every file:
    a file just written beside it was hashed into the fingerprint instead, so the key changed once it
    settled and every stage cached on the corpus was rebuilt on the next run."""
    import os
    import time
    from types import SimpleNamespace

    from distattn.corpus import text
    (tmp_path / "old.txt").write_text("alpha beta\n", encoding="utf-8")
    os.utime(tmp_path / "old.txt", ns=(time.time_ns(), time.time_ns() + 3600 * 10**9))
    (tmp_path / "new.txt").write_text("gamma\n", encoding="utf-8")
    clock = [time.time_ns()]
    monkeypatch.setattr(text, "time", raising=False, value=SimpleNamespace(
        time_ns=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + int(s * 1e9))))
    fresh = TextCorpus(tmp_path).fingerprint()["files"]
    clock[0] += 60 * 10**9
    settled = TextCorpus(tmp_path).fingerprint()["files"]
    assert fresh == settled
    assert [len(f) for f in settled] == [4, 5]         # new.txt as always; old.txt, still ahead, with its sha256
