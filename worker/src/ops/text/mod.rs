//! Text operators: tokenization with a Hugging Face `tokenizer.json`, then truncation and
//! padding to a fixed length, and packing documents into rows.

pub mod pack;
pub mod tokenize;
pub mod tokenize_pad;
pub mod truncate;
pub mod truncate_pad;
