//! The fast path of `text.tokenize`: the same ids as `Tokenizer::encode`, for ASCII text and the
//! common tokenizer layouts, without what the general path builds and `text.tokenize` throws
//! away (the normalized string's alignments, offsets, token strings, the `Encoding`).
//!
//! It applies when the tokenizer's `tokenizer.json` has
//! - no truncation and no padding;
//! - no normalizer, or ones that on ASCII text only lowercase and turn `\t`, `\n`, `\r` into
//!   spaces: `BertNormalizer`, `Lowercase`, `NFC`/`NFD`/`NFKC`/`NFKD`, `StripAccents`, and a
//!   `Sequence` of these;
//! - the pre-tokenizer `BertPreTokenizer` (split on whitespace, each punctuation character
//!   alone) or GPT-2's `ByteLevel` with its regex (`use_regex: true`);
//! - a `WordPiece`, `WordLevel` or `BPE` model (BPE without dropout);
//! - a post-processor that adds the same tokens around every text (found, and checked, by
//!   encoding probe texts both ways when the stage is built).
//!
//! A text takes it when all its bytes are printable ASCII, space, `\t`, `\n` or `\r`, and no added
//! token (`[CLS]`, `<|endoftext|>`...) occurs in it in any letter case; every other text takes the
//! general path. On this path the text is normalized and split by hand, exactly as those
//! components do on such text, and each word goes to the tokenizer's own model
//! (`Model::tokenize`), through a cache of word → ids. A WordPiece word that is in the vocabulary
//! whole is its own id without the cache (the greedy longest match takes it first).

use super::split::{byte_chars, split_bert, split_gpt2};
use super::word_cache::WordCache;
use serde_json::Value;
use tokenizers::{Model, ModelWrapper, Tokenizer};

/// How words are split out of the normalized text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// `BertPreTokenizer`: whitespace ends a word, each ASCII punctuation character is a word.
    Bert,
    /// `ByteLevel` with GPT-2's regex; words are mapped to the byte-level alphabet.
    ByteLevel { add_prefix_space: bool },
}

/// The tokenizer's layout, as far as the fast path needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    lowercase: bool,
    /// `\t`, `\n` and `\r` become spaces (`BertNormalizer`'s `clean_text`).
    whitespace_to_space: bool,
    split: Split,
    /// WordPiece: words of at most this many characters are looked up whole first.
    whole_words: Option<usize>,
}

/// The fast path of one `text.tokenize` stage.
pub(super) struct FastPath {
    layout: Layout,
    /// Ids the post-processor puts before and after the text's.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// The added tokens' contents, lowercased, and which bytes they start with.
    added: Vec<Vec<u8>>,
    added_first: [bool; 256],
    /// The byte-level alphabet (`ByteLevel` only).
    byte_chars: [char; 256],
    cache: WordCache,
    /// The model cannot fail on a word (its unknown token is in its vocabulary, or a BPE has
    /// none): the words past a truncation need not be encoded, since none of them could have
    /// failed the text.
    infallible: bool,
}

impl FastPath {
    /// The fast path for `tokenizer` (read from `json`) encoding with `add_special_tokens`, or
    /// `None` when its layout is not one the fast path reproduces, or when the probe texts do
    /// not encode to the same ids both ways.
    pub(super) fn new(tokenizer: &Tokenizer, json: &[u8], add_special_tokens: bool) -> Option<FastPath> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        let config: Value = serde_json::from_slice(json).ok()?;
        let layout = layout(&config)?;
        let mut added = Vec::new();
        let mut added_first = [false; 256];
        for token in config.get("added_tokens").and_then(Value::as_array).into_iter().flatten() {
            let content = token.get("content")?.as_str()?.to_ascii_lowercase().into_bytes();
            let &first = content.first()?;
            if content.iter().any(|b| b.is_ascii_whitespace()) {
                return None;
            }
            added_first[usize::from(first)] = true;
            added.push(content);
        }
        let mut fast = FastPath {
            layout,
            prefix: Vec::new(),
            suffix: Vec::new(),
            added,
            added_first,
            byte_chars: byte_chars(),
            cache: WordCache::default(),
            infallible: infallible(tokenizer),
        };
        fast.find_special_tokens(tokenizer, add_special_tokens)?;
        Some(fast)
    }

    /// Sets `prefix` and `suffix` from the general path's ids for a probe text, then checks
    /// every probe text against the general path.
    fn find_special_tokens(&mut self, tokenizer: &Tokenizer, add_special_tokens: bool) -> Option<()> {
        const PROBES: &[&str] = &[
            "the quick brown fox",
            "",
            "a",
            "  Hello,   World!  It's 3.14 o'clock; isn't it?\tYes.\r\n",
            "don't you'll we've they're I'm he'd she's 'tis !!! ... ---",
            "x1 2y 3.5 $100 #tag @user e-mail (a) [b] {c} <d> |e| ~f^ `g` _h_",
            "supercalifragilisticexpialidocious-and-then-some-more-words",
            "  \t\n  ",
            "CAPITALS and MiXeD CaSe",
        ];
        let mut core = Vec::new();
        self.encode_words(tokenizer, PROBES[0], &mut core, usize::MAX)?.ok()?;
        let full = tokenizer.encode(PROBES[0], add_special_tokens).ok()?;
        let full = full.get_ids();
        let at = (0..=full.len().checked_sub(core.len())?).find(|&i| full[i..i + core.len()] == core[..])?;
        self.prefix = full[..at].to_vec();
        self.suffix = full[at + core.len()..].to_vec();
        for probe in PROBES {
            let expected = tokenizer.encode(*probe, add_special_tokens).ok()?;
            if expected.get_attention_mask().iter().any(|&m| m != 1) {
                return None;
            }
            let mut ids = Vec::new();
            match self.encode_at_most(tokenizer, probe, usize::MAX, &mut ids) {
                Some(done) => done.ok()?,
                None => continue, // the general path's (the empty text)
            }
            if !ids.iter().map(|&v| u32::try_from(v).ok()).eq(expected.get_ids().iter().map(|&v| Some(v))) {
                return None;
            }
        }
        Some(())
    }

    /// Appends the first `max` of `text`'s ids to `ids` (the post-processor's included: what
    /// cutting the full encoding to `max` gives; `usize::MAX` for all): `None` when the text
    /// needs the general path (then `ids` is unchanged), an error when the model fails on a
    /// word. When the model cannot fail on a word, it stops encoding words once it has the ids
    /// it keeps.
    pub(super) fn encode_at_most(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        max: usize,
        ids: &mut Vec<i64>,
    ) -> Option<Result<(), String>> {
        let limit = if self.infallible { max.saturating_sub(self.prefix.len()) } else { usize::MAX };
        let mut core = Vec::with_capacity((text.len() / 3 + 8).min(limit.saturating_add(8)));
        match self.encode_words(tokenizer, text, &mut core, limit)? {
            Ok(()) => {}
            Err(e) => return Some(Err(e)),
        }
        let all = self.prefix.iter().chain(&core).chain(&self.suffix).take(max);
        ids.reserve(all.size_hint().0);
        ids.extend(all.map(|&v| i64::from(v)));
        Some(Ok(()))
    }

    /// The model's ids for the words of `text`, without the post-processor's; once `ids` holds
    /// `limit` of them, the remaining words are skipped.
    fn encode_words(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        limit: usize,
    ) -> Option<Result<(), String>> {
        let bytes = text.as_bytes();
        if bytes.is_empty()
            || !bytes.iter().all(|&b| matches!(b, b'\t' | b'\n' | b'\r' | b' '..=b'~'))
            || self.has_added_token(bytes)
        {
            return None;
        }
        let mut normalized = Vec::with_capacity(bytes.len() + 1);
        if let Split::ByteLevel { add_prefix_space: true } = self.layout.split
            && bytes.first() != Some(&b' ')
            && !(self.layout.whitespace_to_space && matches!(bytes.first(), Some(b'\t' | b'\n' | b'\r')))
        {
            normalized.push(b' ');
        }
        normalized.extend(bytes.iter().map(|&b| match b {
            b'\t' | b'\n' | b'\r' if self.layout.whitespace_to_space => b' ',
            b'A'..=b'Z' if self.layout.lowercase => b + 32,
            _ => b,
        }));
        let mut result = Ok(());
        let mut word = |w: &[u8]| {
            if result.is_ok() && ids.len() < limit {
                result = self.word_ids(tokenizer, w, ids);
            }
        };
        match self.layout.split {
            Split::Bert => split_bert(&normalized, &mut word),
            Split::ByteLevel { .. } => split_gpt2(&normalized, &mut word),
        }
        Some(result)
    }

    /// Whether an added token's content occurs in `bytes`, ignoring ASCII case.
    fn has_added_token(&self, bytes: &[u8]) -> bool {
        if !bytes.iter().any(|b| self.added_first[usize::from(b.to_ascii_lowercase())]) {
            return false;
        }
        let lower = bytes.to_ascii_lowercase();
        self.added.iter().any(|content| lower.windows(content.len()).any(|w| w == &content[..]))
    }

    /// Appends one word's ids.
    fn word_ids(&self, tokenizer: &Tokenizer, word: &[u8], ids: &mut Vec<u32>) -> Result<(), String> {
        let model = tokenizer.get_model();
        if let Some(max) = self.layout.whole_words
            && word.len() <= max
            && let Some(id) = std::str::from_utf8(word).ok().and_then(|w| model.token_to_id(w))
        {
            ids.push(id);
            return Ok(());
        }
        if self.cache.extend(word, ids) {
            return Ok(());
        }
        let text = match self.layout.split {
            Split::Bert => String::from_utf8_lossy(word).into_owned(),
            Split::ByteLevel { .. } => word.iter().map(|&b| self.byte_chars[usize::from(b)]).collect(),
        };
        let tokens = model.tokenize(&text).map_err(|e| e.to_string())?;
        let start = ids.len();
        ids.extend(tokens.iter().map(|t| t.id));
        self.cache.insert(word, &ids[start..]);
        Ok(())
    }
}

/// Whether `tokenizer`'s model encodes every word without an error: a WordPiece or WordLevel
/// model fails only on a word it does not know when its unknown token is missing from its
/// vocabulary, and a BPE only when it names an unknown token that is missing.
fn infallible(tokenizer: &Tokenizer) -> bool {
    let model = tokenizer.get_model();
    let known = |token: &str| model.token_to_id(token).is_some();
    match model {
        ModelWrapper::WordPiece(m) => known(&m.unk_token),
        ModelWrapper::WordLevel(m) => known(&m.unk_token),
        ModelWrapper::BPE(m) => m.unk_token.as_deref().is_none_or(known),
        ModelWrapper::Unigram(_) => false,
    }
}

/// Reads the layout from `tokenizer.json`; `None` when the fast path does not reproduce it.
fn layout(config: &Value) -> Option<Layout> {
    let mut lowercase = false;
    let mut whitespace_to_space = false;
    if let Some(n) = config.get("normalizer").filter(|n| !n.is_null()) {
        normalizer(n, &mut lowercase, &mut whitespace_to_space)?;
    }
    let pre = config.get("pre_tokenizer")?;
    let split = match pre.get("type")?.as_str()? {
        "BertPreTokenizer" => Split::Bert,
        "ByteLevel" if pre.get("use_regex").and_then(Value::as_bool).unwrap_or(true) => Split::ByteLevel {
            add_prefix_space: pre.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(true),
        },
        _ => return None,
    };
    let model = config.get("model")?;
    let whole_words = match model.get("type")?.as_str()? {
        "WordPiece" if split == Split::Bert => {
            Some(model.get("max_input_chars_per_word").and_then(Value::as_u64).unwrap_or(100) as usize)
        }
        "WordPiece" | "WordLevel" => None,
        "BPE" if model.get("dropout").is_none_or(Value::is_null) => None,
        _ => return None,
    };
    Some(Layout { lowercase, whitespace_to_space, split, whole_words })
}

/// Adds one normalizer's effect on ASCII text; `None` for one the fast path does not know.
fn normalizer(n: &Value, lowercase: &mut bool, whitespace_to_space: &mut bool) -> Option<()> {
    match n.get("type")?.as_str()? {
        "BertNormalizer" => {
            *lowercase |= n.get("lowercase").and_then(Value::as_bool).unwrap_or(true);
            *whitespace_to_space |= n.get("clean_text").and_then(Value::as_bool).unwrap_or(true);
        }
        "Lowercase" => *lowercase = true,
        "NFC" | "NFD" | "NFKC" | "NFKD" | "StripAccents" => {}
        "Sequence" => {
            for inner in n.get("normalizers")?.as_array()? {
                normalizer(inner, lowercase, whitespace_to_space)?;
            }
        }
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> (Tokenizer, Vec<u8>) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer").join(name);
        let bytes = std::fs::read(&path).unwrap();
        (Tokenizer::from_bytes(&bytes).unwrap(), bytes)
    }

    /// Deterministic texts that stress the splitting rules: words from the fixtures' corpus in
    /// any case, contractions, runs of every kind of whitespace, punctuation, digits, long
    /// words, added tokens, and some non-ASCII (which takes the general path).
    fn texts() -> Vec<String> {
        let mut texts: Vec<String> = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/cases.jsonl"),
        )
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?.get("text")?.as_str().map(str::to_string))
        .collect();
        const PIECES: &[&str] = &[
            "the",
            "The",
            "THE",
            "tokenizer",
            "tokenization",
            "Pipeline",
            "data",
            "model",
            "xq",
            "zzzz",
            "unbelievable",
            "internationalization",
            " ",
            " ",
            " ",
            "  ",
            "   ",
            "\t",
            "\n",
            "\r\n",
            " \t ",
            "'s",
            "'t",
            "'re",
            "'ve",
            "'m",
            "'ll",
            "'d",
            "'",
            "''",
            "'x",
            "'S",
            "n't",
            ",",
            ".",
            "...",
            "!",
            "?",
            ";",
            ":",
            "-",
            "--",
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            "<",
            ">",
            "|",
            "~",
            "^",
            "`",
            "_",
            "#",
            "##",
            "##ing",
            "@",
            "$",
            "%",
            "&",
            "*",
            "+",
            "=",
            "/",
            "\\",
            "\"",
            "0",
            "7",
            "42",
            "3.14",
            "2024",
            "x1",
            "1x",
            "a",
            "I",
            "[CLS]",
            "[sep]",
            "[MASK",
            "<|endoftext|>",
            "<|",
            "é",
            "café",
            "中文",
            "\u{0}",
            "\u{7f}",
            "\u{b}",
            "\u{c}",
            "\u{1f}",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..20_000 {
            let parts = 1 + next(24);
            let mut text = String::new();
            for _ in 0..parts {
                match next(20) {
                    0 => text.push_str(&"abcdefghij".repeat(1 + next(15))),
                    1 => text.push(char::from(b' ' + next(95) as u8)),
                    _ => text.push_str(PIECES[next(PIECES.len())]),
                }
            }
            texts.push(text);
        }
        texts
    }

    fn check(name: &str, add_special_tokens: bool) -> usize {
        let (tokenizer, json) = fixture(name);
        let fast = FastPath::new(&tokenizer, &json, add_special_tokens)
            .unwrap_or_else(|| panic!("{name}: no fast path"));
        let mut taken = 0;
        for text in texts() {
            let expected = tokenizer.encode(text.as_str(), add_special_tokens).unwrap();
            let mut ids = Vec::new();
            match fast.encode_at_most(&tokenizer, &text, usize::MAX, &mut ids) {
                Some(done) => {
                    done.unwrap();
                    taken += 1;
                    let expected: Vec<i64> = expected.get_ids().iter().map(|&v| i64::from(v)).collect();
                    assert_eq!(ids, expected, "{name}, special tokens {add_special_tokens}: {text:?}");
                }
                None => assert!(ids.is_empty()),
            }
        }
        taken
    }

    #[test]
    fn wordpiece_ids_match_the_general_path() {
        for special in [true, false] {
            let taken = check("wordpiece.json", special);
            assert!(taken > 5_000, "the fast path took {taken} texts");
        }
    }

    #[test]
    fn byte_level_ids_match_the_general_path() {
        for special in [true, false] {
            let taken = check("bytelevel.json", special);
            assert!(taken > 5_000, "the fast path took {taken} texts");
        }
    }

    #[test]
    fn truncating_or_padding_tokenizers_take_the_general_path() {
        let (tokenizer, json) = fixture("wordpiece_padded.json");
        assert!(FastPath::new(&tokenizer, &json, true).is_none());
    }
}
