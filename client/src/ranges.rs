//! Sets of slot numbers kept as sorted, disjoint `[start, end)` ranges.

/// Slot numbers as sorted, disjoint, non-adjacent `[start, end)` ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlotRanges {
    ranges: Vec<(u64, u64)>,
}

impl SlotRanges {
    /// The set of the given ranges; they must be non-empty, sorted and disjoint.
    pub(crate) fn from_ranges(ranges: &[(u64, u64)]) -> Result<SlotRanges, String> {
        let mut set = SlotRanges::default();
        let mut previous_end = None;
        for &(start, end) in ranges {
            if start >= end {
                return Err(format!("empty or reversed range [{start}, {end})"));
            }
            if previous_end.is_some_and(|previous| start < previous) {
                return Err(format!("range [{start}, {end}) is out of order or overlaps the one before"));
            }
            previous_end = Some(end);
            match set.ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => set.ranges.push((start, end)),
            }
        }
        Ok(set)
    }

    /// Whether `slot` is in the set.
    pub(crate) fn contains(&self, slot: u64) -> bool {
        let index = self.ranges.partition_point(|&(start, _)| start <= slot);
        index > 0 && self.ranges[index - 1].1 > slot
    }

    /// Adds `slot`, merging neighbouring ranges.
    pub(crate) fn insert(&mut self, slot: u64) {
        let index = self.ranges.partition_point(|&(start, _)| start <= slot);
        if index > 0 {
            let previous = &mut self.ranges[index - 1];
            if previous.1 > slot {
                return;
            }
            if previous.1 == slot {
                previous.1 = slot + 1;
                let end = previous.1;
                if let Some(&(next_start, next_end)) = self.ranges.get(index)
                    && next_start == end
                {
                    self.ranges[index - 1].1 = next_end;
                    self.ranges.remove(index);
                }
                return;
            }
        }
        match self.ranges.get_mut(index) {
            Some(next) if next.0 == slot + 1 => next.0 = slot,
            _ => self.ranges.insert(index, (slot, slot + 1)),
        }
    }

    /// Number of slots in the set.
    pub(crate) fn count(&self) -> u64 {
        self.ranges.iter().map(|&(start, end)| end - start).sum()
    }

    /// The ranges, sorted.
    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_merge_neighbours() {
        let mut set = SlotRanges::default();
        for slot in [5, 0, 2, 1, 7, 6, 9] {
            set.insert(slot);
        }
        assert_eq!(set.ranges(), &[(0, 3), (5, 8), (9, 10)]);
        set.insert(8);
        set.insert(3);
        set.insert(3);
        assert_eq!(set.ranges(), &[(0, 4), (5, 10)]);
        assert_eq!(set.count(), 9);
        assert!(set.contains(0) && set.contains(9) && !set.contains(4) && !set.contains(10));
    }

    #[test]
    fn validates_ranges() {
        assert_eq!(SlotRanges::from_ranges(&[(0, 2), (2, 4), (6, 7)]).unwrap().ranges(), &[(0, 4), (6, 7)]);
        assert!(SlotRanges::from_ranges(&[(3, 3)]).is_err());
        assert!(SlotRanges::from_ranges(&[(4, 6), (0, 2)]).is_err());
        assert!(SlotRanges::from_ranges(&[(0, 4), (3, 6)]).is_err());
    }
}
