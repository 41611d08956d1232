//! The kinds of data operators take and give, for checking the order of stages.

/// What an operator reads from its field, or writes to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Encoded image bytes (JPEG, PNG), as a source gives them.
    EncodedImage,
    /// Decoded RGB `uint8` pixels, height × width × 3.
    Pixels,
    /// The finished image tensor; no image operator may follow on its field.
    ImageTensor,
    /// Text.
    Text,
    /// Token ids and their attention mask (`input_ids`, `attention_mask`).
    Tokens,
    /// The columns of a row.
    Columns,
    /// Whatever the element holds, passed on unchanged.
    Any,
}
