//! A set of logical CPU IDs, written as Linux writes CPU lists (`0-3,8`):
//! the kubelet's `k8s.io/utils/cpuset.CPUSet`, the form of `cpuset.cpus`,
//! of CRI's `cpuset_cpus` and of the CPU manager's checkpoint.

use std::collections::BTreeSet;
use std::fmt;

/// The most CPU IDs a list may name: a list read from a file or a
/// configuration never expands to more (`0-4000000000` is refused).
pub const MAX_CPUS: usize = 8192;

/// Errors reading a CPU list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A part of the list is neither a number nor a range `a-b` with `a <= b`.
    #[error("invalid CPU list {list:?}: {part:?} is not a CPU ID or a range of them")]
    Invalid {
        /// The whole list.
        list: String,
        /// The part that is wrong.
        part: String,
    },
    /// The list names a CPU ID at or above [`MAX_CPUS`].
    #[error("invalid CPU list {list:?}: CPU IDs stop below {MAX_CPUS}")]
    TooLarge {
        /// The whole list.
        list: String,
    },
}

/// A set of logical CPU IDs, ordered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    /// The empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a Linux CPU list: comma-separated IDs and inclusive ranges,
    /// blanks around them ignored, `""` the empty set (as `cpuset.Parse`).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a part that is not an ID or a range with its
    /// start at or below its end; [`Error::TooLarge`] for an ID at or above
    /// [`MAX_CPUS`].
    pub fn parse(list: &str) -> Result<Self, Error> {
        let mut set = BTreeSet::new();
        let trimmed = list.trim();
        if trimmed.is_empty() {
            return Ok(Self(set));
        }
        let invalid = |part: &str| Error::Invalid {
            list: list.to_string(),
            part: part.to_string(),
        };
        for part in trimmed.split(',') {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
                return Err(invalid(part));
            };
            if a > b {
                return Err(invalid(part));
            }
            if b >= MAX_CPUS {
                return Err(Error::TooLarge {
                    list: list.to_string(),
                });
            }
            set.extend(a..=b);
        }
        Ok(Self(set))
    }

    /// The number of CPUs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no CPU is in the set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when `cpu` is in the set.
    #[must_use]
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// The IDs, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// The CPUs in both sets.
    #[must_use]
    pub fn intersection(&self, other: &Self) -> Self {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    /// The CPUs in either set.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).copied().collect())
    }

    /// The CPUs of `self` not in `other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// True when every CPU of `self` is in `other`.
    #[must_use]
    pub fn is_subset(&self, other: &Self) -> bool {
        self.0.is_subset(&other.0)
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: usize) {
        self.0.insert(cpu);
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// The Linux list form, ranges joined: `0-3,8`; `""` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut ids = self.0.iter().copied().peekable();
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_and_write_as_linux_writes_them() {
        for (text, shown, len) in [
            ("", "", 0),
            ("0", "0", 1),
            ("0-3,8", "0-3,8", 5),
            (" 5, 1-2 ,3 ", "1-3,5", 4),
            ("2-2", "2", 1),
            ("0,2,4,6", "0,2,4,6", 4),
        ] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(set.to_string(), shown, "{text:?}");
            assert_eq!(set.len(), len, "{text:?}");
        }
        for bad in [
            "a",
            "3-1",
            "1-",
            "-1",
            "1,,2",
            "0-8192",
            "99999999999999999999",
        ] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            CpuSet::parse("0-8192"),
            Err(Error::TooLarge {
                list: "0-8192".into()
            })
        );
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse("0-5").unwrap();
        let b = CpuSet::parse("4-7").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-5");
        assert_eq!(a.union(&b).to_string(), "0-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(CpuSet::parse("1,3").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
    }
}
