//! Text operators: tokenization with a Hugging Face `tokenizer.json`, then truncation and
//! padding to a fixed length.

pub mod tokenize;
pub mod truncate;
pub mod truncate_pad;
