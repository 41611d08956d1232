//! Splitting ASCII text into words as the `tokenizers` crate's pre-tokenizers do on it, for the
//! fast path of `text.tokenize`.

/// `BertPreTokenizer` on ASCII: whitespace separates words and is dropped; every punctuation
/// character is a word of its own.
pub(super) fn split_bert(text: &[u8], word: &mut impl FnMut(&[u8])) {
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        let space = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        if space || b.is_ascii_punctuation() {
            if start < i {
                word(&text[start..i]);
            }
            if !space {
                word(&text[i..=i]);
            }
            start = i + 1;
        }
    }
    if start < text.len() {
        word(&text[start..]);
    }
}

/// The class of an ASCII byte in GPT-2's regex.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        b' ' | b'\t' | b'\n' | b'\r' => Class::Space,
        _ => Class::Other,
    }
}

/// GPT-2's pre-tokenizer regex on ASCII, matched as Oniguruma does (first alternative that
/// matches, left to right):
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
pub(super) fn split_gpt2(text: &[u8], word: &mut impl FnMut(&[u8])) {
    let run = |from: usize, c: Class| from + text[from..].iter().take_while(|&&b| class(b) == c).count();
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        let end = if b == b'\'' && contraction(&text[i + 1..]) > 0 {
            i + 1 + contraction(&text[i + 1..])
        } else {
            match class(b) {
                Class::Letter | Class::Digit | Class::Other => run(i, class(b)),
                Class::Space => {
                    let next = text.get(i + 1).map(|&n| class(n));
                    match next {
                        Some(c @ (Class::Letter | Class::Digit | Class::Other)) if b == b' ' => run(i + 1, c),
                        _ => {
                            let spaces = run(i, Class::Space);
                            if spaces == text.len() || spaces == i + 1 {
                                // the run ends the text, or one whitespace before a non-space
                                // that is not ` ` (`\s+` alone)
                                spaces
                            } else {
                                // `\s+(?!\S)` backs off one: the last whitespace goes with what
                                // follows
                                spaces - 1
                            }
                        }
                    }
                }
            }
        };
        word(&text[i..end]);
        i = end;
    }
}

/// Length of the contraction after an apostrophe (`s`, `t`, `re`, `ve`, `m`, `ll`, `d`), or 0.
fn contraction(rest: &[u8]) -> usize {
    match rest {
        [b's' | b't' | b'm' | b'd', ..] => 1,
        [b'r', b'e', ..] | [b'v', b'e', ..] | [b'l', b'l', ..] => 2,
        _ => 0,
    }
}

/// GPT-2's byte → character table, as the `ByteLevel` pre-tokenizer maps bytes.
pub(super) fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[usize::from(b)] = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_splits_as_the_regex() {
        let mut words = Vec::new();
        split_gpt2(b"Hi  there's\t\tx !!'s 12ab  ", &mut |w: &[u8]| {
            words.push(String::from_utf8_lossy(w).into_owned())
        });
        assert_eq!(words, ["Hi", " ", " there", "'s", "\t", "\t", "x", " !!'", "s", " 12", "ab", "  "]);
    }
}
