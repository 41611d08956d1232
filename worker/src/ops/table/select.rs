//! `table.select`: keeps only the named columns, in the given order.

use crate::element::Element;
use crate::ops::text::tokenize::field_names;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::Select;

/// Keeps only the listed fields, in the listed order; every listed field must exist.
pub struct SelectOp {
    columns: Vec<String>,
}

impl SelectOp {
    /// The operator for one `table.select` stage.
    pub fn new(cfg: &Select) -> SelectOp {
        SelectOp { columns: cfg.columns.clone() }
    }
}

impl Operator for SelectOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        // Already these columns in this order (as a reader the select was pushed into gives
        // them): nothing to move.
        if element.fields.len() == self.columns.len()
            && element.fields.iter().zip(&self.columns).all(|((name, _), column)| name == column)
        {
            return Ok(());
        }
        // Every listed column must be there before any moves. Columns are usually listed in the
        // order rows hold them, so each search starts after the last column found.
        let mut next = 0;
        let all_there = self.columns.iter().all(|c| {
            let found = element.position_from(c, next);
            next = found.map_or(next, |i| i + 1);
            found.is_some()
        });
        if !all_there {
            let missing: Vec<String> =
                self.columns.iter().filter(|c| element.get(c).is_none()).map(|c| format!("`{c}`")).collect();
            return Err(OpError::new(format!(
                "table.select: element `{}` has no column {} (its columns: {}); fix `columns` \
                 to name existing columns",
                element.key,
                missing.join(", "),
                field_names(element)
            )));
        }
        // Each listed column is swapped into its place in turn, then the rest are cut off: no
        // new list for every row.
        let mut placed = 0;
        for column in &self.columns {
            if let Some(i) = element.fields[placed..].iter().position(|(n, _)| n == column) {
                element.fields.swap(placed, placed + i);
                placed += 1;
            }
        }
        element.fields.truncate(placed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Value;
    use crate::tensor::Tensor;

    fn op(cols: &[&str]) -> SelectOp {
        SelectOp::new(&Select { columns: cols.iter().map(|c| c.to_string()).collect() })
    }

    fn row() -> Element {
        let mut el = Element::new("rows.parquet#3");
        el.set("id", Value::Tensor(Tensor::scalar_i64(3)));
        el.set("label", Value::Tensor(Tensor::scalar_i64(1)));
        el.set("f0", Value::Tensor(Tensor::scalar_f64(0.5)));
        el.set("category", Value::Text("b".into()));
        el
    }

    fn names(el: &Element) -> Vec<&str> {
        el.fields.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn keeps_listed_columns_in_listed_order() {
        let mut el = row();
        op(&["f0", "id", "category"]).apply(&mut el, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap();
        assert_eq!(names(&el), ["f0", "id", "category"]);
        assert_eq!(el.get("f0"), Some(&Value::Tensor(Tensor::scalar_f64(0.5))));
        assert_eq!(el.get("category"), Some(&Value::Text("b".into())));
        assert_eq!(el.key, "rows.parquet#3");
    }

    #[test]
    fn columns_already_in_place_stay_and_fewer_or_reordered_ones_move() {
        let rng = &mut SeededRng::for_element(0, 0, 0, 0);
        let mut el = row();
        op(&["id", "label", "f0", "category"]).apply(&mut el, rng).unwrap();
        assert_eq!(el, row(), "all of them, in their order");
        op(&["id", "label", "f0"]).apply(&mut el, rng).unwrap();
        assert_eq!(names(&el), ["id", "label", "f0"], "a prefix");
        op(&["f0", "id", "label"]).apply(&mut el, rng).unwrap();
        assert_eq!(names(&el), ["f0", "id", "label"], "the same columns, another order");
        assert_eq!(el.get("label"), Some(&Value::Tensor(Tensor::scalar_i64(1))));
    }

    #[test]
    fn missing_column_lists_the_elements_columns() {
        let mut el = row();
        let e =
            op(&["id", "f9", "lable"]).apply(&mut el, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap_err();
        assert!(e.0.contains("no column `f9`, `lable`"), "{e}");
        assert!(e.0.contains("`id`, `label`, `f0`, `category`"), "{e}");
        assert!(e.0.contains("rows.parquet#3"), "{e}");
        assert_eq!(el, row(), "element untouched on error");
    }
}
