//! What each stage does to an element, as the rewrite rules need to know it: the fields it reads
//! and writes, whether it draws random numbers, and what part it plays (filter, projection,
//! geometric image op, final conversion).

use granary_crds::OpConfig;
use granary_crds::ops::{ImageDType, Layout};
use std::collections::BTreeSet;

/// A set of element fields, or "any field" when a stage does not say which it touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fields {
    /// Exactly these fields.
    Known(BTreeSet<String>),
    /// Possibly every field (an undeclared Python function, an unparsable stage).
    Any,
}

impl Fields {
    /// No field.
    pub fn none() -> Fields {
        Fields::Known(BTreeSet::new())
    }

    /// The given fields.
    pub fn of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Fields {
        Fields::Known(names.into_iter().map(|n| n.as_ref().to_string()).collect())
    }

    /// Whether the two sets may share a field.
    pub fn meets(&self, other: &Fields) -> bool {
        match (self, other) {
            (Fields::Known(a), Fields::Known(b)) => !a.is_disjoint(b),
            (Fields::Known(a), Fields::Any) | (Fields::Any, Fields::Known(a)) => !a.is_empty(),
            (Fields::Any, Fields::Any) => true,
        }
    }

    /// Whether every field of `self` is in `set`.
    pub fn within(&self, set: &BTreeSet<String>) -> bool {
        match self {
            Fields::Known(a) => a.is_subset(set),
            Fields::Any => false,
        }
    }

    /// The known fields, if known.
    pub fn known(&self) -> Option<&BTreeSet<String>> {
        match self {
            Fields::Known(a) => Some(a),
            Fields::Any => None,
        }
    }
}

/// The part a stage plays in reordering.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// Drops elements (`filter`, `python.filter`): the earlier, the less work is wasted.
    Filter,
    /// Keeps only these fields (`table.select`).
    Select(BTreeSet<String>),
    /// Makes an image smaller (`image.resize`, `image.center_crop`,
    /// `image.random_resized_crop`) on this field.
    Shrink(String),
    /// Mirrors an image on this field (`image.flip`).
    Flip(String),
    /// Converts an image to its final tensor (`image.normalize`) on this field; `identity` when
    /// it is `uint8` HWC, which leaves the pixels as they are; `hwc` when the output keeps the
    /// image's axes.
    Normalize {
        /// The image field.
        field: String,
        /// `uint8` with layout HWC: the output is the input.
        identity: bool,
        /// Layout HWC: the output is still `[height, width, 3]`.
        hwc: bool,
    },
    /// Rows from a whole split (`text.pack`): keeps only the packed field's output.
    Pack(String),
    /// Anything else.
    Other,
}

/// What a stage does to an element.
#[derive(Clone, Debug)]
pub struct Effects {
    /// Fields it reads.
    pub reads: Fields,
    /// Fields it adds, replaces or removes.
    pub writes: Fields,
    /// Whether it draws from the element's random stream. Two random stages never swap: their
    /// draws would come in another order.
    pub random: bool,
    /// Whether any rule may move it or move another stage across it.
    pub movable: bool,
    /// Its part in reordering.
    pub role: Role,
    /// Whether it is a filter on the minimum image size of this field.
    pub min_size_of: Option<String>,
    /// Whether it hands the element's fields to another process (a Python stage): fields a
    /// select drops before it are then not copied across. Elsewhere the executor moves fields
    /// without copying them, so carrying one costs nothing.
    pub crosses: bool,
}

impl Effects {
    /// A stage nothing may move across (unparsable, or one whose effects are unknown).
    pub fn barrier() -> Effects {
        Effects {
            reads: Fields::Any,
            writes: Fields::Any,
            random: true,
            movable: false,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        }
    }
}

fn on(field: &str, random: bool, role: Role) -> Effects {
    Effects {
        reads: Fields::of([field]),
        writes: Fields::of([field]),
        random,
        movable: true,
        role,
        min_size_of: None,
        crosses: false,
    }
}

/// The effects of a parsed stage; `None` (a stage that did not parse) is a barrier.
pub fn of(config: Option<&OpConfig>) -> Effects {
    let Some(config) = config else { return Effects::barrier() };
    match config {
        OpConfig::ImageDecode(c) => on(&c.field, false, Role::Other),
        OpConfig::ImageResize(c) => on(&c.field, false, Role::Shrink(c.field.clone())),
        OpConfig::ImageCenterCrop(c) => on(&c.field, false, Role::Shrink(c.field.clone())),
        OpConfig::ImageRandomResizedCrop(c) => on(&c.field, true, Role::Shrink(c.field.clone())),
        OpConfig::ImageFlip(c) => on(&c.field, true, Role::Flip(c.field.clone())),
        OpConfig::ImageNormalize(c) => on(
            &c.field,
            false,
            Role::Normalize {
                field: c.field.clone(),
                identity: c.dtype == ImageDType::Uint8 && c.layout == Layout::HWC,
                hwc: c.layout == Layout::HWC,
            },
        ),
        OpConfig::TextTokenize(c) => Effects {
            reads: Fields::of([c.field.as_str()]),
            // The text field is removed; the token tensors are added.
            writes: Fields::of([c.field.as_str(), "input_ids", "attention_mask"]),
            random: false,
            movable: true,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TextTruncatePad(_) => Effects {
            reads: Fields::of(["input_ids", "attention_mask"]),
            writes: Fields::of(["input_ids", "attention_mask"]),
            random: false,
            movable: true,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TextTruncate(c) => Effects {
            reads: Fields::of(&c.fields),
            writes: Fields::of(&c.fields),
            random: false,
            movable: true,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TextPack(c) => Effects {
            reads: Fields::of([c.field.as_str()]),
            writes: Fields::Any,
            random: false,
            // Rows are built from a split's elements in order: nothing crosses it.
            movable: false,
            role: Role::Pack(c.field.clone()),
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TableSelect(c) => Effects {
            reads: Fields::of(&c.columns),
            writes: Fields::Any,
            random: false,
            movable: true,
            role: Role::Select(c.columns.iter().cloned().collect()),
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TableCast(c) => Effects {
            reads: Fields::of(c.columns.keys()),
            writes: Fields::of(c.columns.keys()),
            random: false,
            movable: true,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        },
        OpConfig::TestSleep(_) => Effects {
            reads: Fields::none(),
            writes: Fields::none(),
            random: false,
            movable: true,
            role: Role::Other,
            min_size_of: None,
            crosses: false,
        },
        OpConfig::PythonMap(c) => {
            let declared = c.reads.is_some() && c.writes.is_some();
            Effects {
                reads: c.reads.as_ref().map_or(Fields::Any, Fields::of),
                writes: c.writes.as_ref().map_or(Fields::Any, Fields::of),
                random: !c.deterministic,
                // A batched random function draws one stream per group, whose members a moved
                // filter would change.
                movable: declared && (c.deterministic || !c.batched),
                role: Role::Other,
                min_size_of: None,
                crosses: true,
            }
        }
        OpConfig::PythonFilter(c) => Effects {
            reads: c.reads.as_ref().map_or(Fields::Any, Fields::of),
            writes: Fields::none(),
            random: !c.deterministic,
            movable: c.reads.is_some() && (c.deterministic || !c.batched),
            role: Role::Filter,
            min_size_of: None,
            crosses: true,
        },
        OpConfig::Filter(c) => {
            let min_size = matches!(c.test(), Some(granary_crds::ops::filter::Test::MinSize { .. }));
            Effects {
                reads: Fields::of([c.field()]),
                writes: Fields::none(),
                random: false,
                movable: true,
                role: Role::Filter,
                min_size_of: min_size.then(|| c.field().to_string()),
                crosses: false,
            }
        }
    }
}
