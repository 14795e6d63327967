//! Replica constraints: which nodes may hold a key range's replicas.
//!
//! A shard's constraints are a list of `+attribute=value` (every replica's node must have it)
//! and `-attribute=value` (no replica's node may have it), the attributes being a node's
//! `region` and `zone` (`--region`, `--zone`; a zone is compared by its label alone, whatever
//! its region). Written as text, comma-separated: `+region=eu-west`, `-region=ap-south`,
//! `+region=us-east,-zone=c`. The empty list allows every node.
//!
//! They are how data is kept inside a jurisdiction (`-region=ap-south`: none of this range's
//! data is stored there), off a failing rack (`-zone=c`), or pinned to one region (with the
//! caveat that a shard all of whose replicas sit in one region cannot survive losing it).
//! The same rule as CockroachDB's per-replica `constraints` with required and prohibited
//! entries; per-replica counts (`{+region=a: 2}`) and node attributes beyond region and zone
//! are not supported.
//!
//! This module is the pure part, shared by the server (which stores constraints in the shard
//! map, places founding replicas by them and refuses moves that break them) and the client
//! (which plans the moves that make a shard obey new constraints).
//!
//! # Invariants
//! - A parsed list is canonical: sorted, without duplicates, every value non-empty and free of
//!   separators, at most [`MAX_CONSTRAINTS`] entries; [`Constraints::parse`] of its
//!   [`Display`](std::fmt::Display) text gives it back.
//! - A list that no node could satisfy on its face (`+region=a,+region=b`,
//!   `+region=a,-region=a`) is refused when parsed; one that no *member* satisfies is refused
//!   where members are known (the server's placement checks).

use std::fmt;

/// Most entries one shard's constraints may have.
pub const MAX_CONSTRAINTS: usize = 16;
/// Longest value (a region or zone name) a constraint may name, in bytes.
pub const MAX_CONSTRAINT_VALUE: usize = 64;

/// A node attribute a constraint tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Attribute {
    Region,
    Zone,
}

impl Attribute {
    pub fn as_str(self) -> &'static str {
        match self {
            Attribute::Region => "region",
            Attribute::Zone => "zone",
        }
    }
}

/// One entry: a node must (`required`) or must not have `attribute` = `value`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Constraint {
    pub attribute: Attribute,
    pub value: String,
    pub required: bool,
}

impl Constraint {
    fn matches(&self, region: &str, zone: &str) -> bool {
        let have = match self.attribute {
            Attribute::Region => region,
            Attribute::Zone => zone,
        };
        (have == self.value) == self.required
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.required { '+' } else { '-' };
        write!(f, "{sign}{}={}", self.attribute.as_str(), self.value)
    }
}

/// A shard's replica constraints (see the module docs); empty: any node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Constraints(Vec<Constraint>);

impl Constraints {
    /// Parses `+attr=value,-attr=value,...`. Empty text (or `none`) is no constraint.
    pub fn parse(text: &str) -> Result<Constraints, String> {
        let text = text.trim();
        if text.is_empty() || text == "none" {
            return Ok(Constraints::default());
        }
        let mut list = Vec::new();
        for raw in text.split(',') {
            let entry = raw.trim();
            let (required, rest) = match entry.split_at_checked(1) {
                Some(("+", rest)) => (true, rest),
                Some(("-", rest)) => (false, rest),
                _ => {
                    return Err(format!(
                        "constraint {entry:?} must start with + (required) or - (prohibited), \
                         as in +region=eu-west or -zone=c"
                    ))
                }
            };
            let (attribute, value) = rest.split_once('=').ok_or_else(|| {
                format!("constraint {entry:?} is not of the form ±attribute=value")
            })?;
            let attribute = match attribute.trim() {
                "region" => Attribute::Region,
                "zone" => Attribute::Zone,
                other => {
                    return Err(format!(
                        "constraint {entry:?} names attribute {other:?}; the attributes are \
                         region and zone"
                    ))
                }
            };
            let value = value.trim();
            if value.is_empty() {
                return Err(format!("constraint {entry:?} names no value"));
            }
            if value.len() > MAX_CONSTRAINT_VALUE {
                return Err(format!(
                    "constraint {entry:?}: the value is longer than {MAX_CONSTRAINT_VALUE} bytes"
                ));
            }
            if value
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, ',' | '=' | ':' | '+'))
            {
                return Err(format!(
                    "constraint {entry:?}: a value may not hold spaces, ',', '=', ':' or '+'"
                ));
            }
            list.push(Constraint {
                attribute,
                value: value.to_string(),
                required,
            });
        }
        list.sort();
        list.dedup();
        if list.len() > MAX_CONSTRAINTS {
            return Err(format!(
                "{} constraints; at most {MAX_CONSTRAINTS} are allowed",
                list.len()
            ));
        }
        for attribute in [Attribute::Region, Attribute::Zone] {
            let required: Vec<&Constraint> = list
                .iter()
                .filter(|c| c.attribute == attribute && c.required)
                .collect();
            if required.len() > 1 {
                return Err(format!(
                    "{} and {} cannot both hold: a node has one {}",
                    required[0],
                    required[1],
                    attribute.as_str()
                ));
            }
            if let Some(need) = required.first() {
                if list
                    .iter()
                    .any(|c| c.attribute == attribute && !c.required && c.value == need.value)
                {
                    return Err(format!(
                        "{need} contradicts -{}={}",
                        attribute.as_str(),
                        need.value
                    ));
                }
            }
        }
        Ok(Constraints(list))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text a status reports (`ShardInfo.constraints`): the canonical one, empty for none.
    pub fn status_text(&self) -> String {
        match self.is_empty() {
            true => String::new(),
            false => self.to_string(),
        }
    }

    pub fn entries(&self) -> &[Constraint] {
        &self.0
    }

    /// Whether a node in `region` and `zone` may hold a replica.
    pub fn allows(&self, region: &str, zone: &str) -> bool {
        self.0.iter().all(|c| c.matches(region, zone))
    }

    /// The entries a node in `region` and `zone` breaks, as text (for error messages).
    pub fn broken_by(&self, region: &str, zone: &str) -> String {
        let broken: Vec<String> = self
            .0
            .iter()
            .filter(|c| !c.matches(region, zone))
            .map(Constraint::to_string)
            .collect();
        broken.join(",")
    }
}

impl fmt::Display for Constraints {
    /// The canonical text (`none` for the empty list).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_and_prohibited_entries_test_region_and_zone() {
        let c = Constraints::parse("+region=eu-west, -zone=c").unwrap();
        assert!(c.allows("eu-west", "a"));
        assert!(!c.allows("eu-west", "c"), "prohibited zone");
        assert!(!c.allows("us-east", "a"), "required region");
        assert_eq!(c.broken_by("us-east", "c"), "+region=eu-west,-zone=c");
        let none = Constraints::parse("").unwrap();
        assert!(none.is_empty() && none.allows("anything", ""));
        assert_eq!(Constraints::parse("none").unwrap(), none);
        let out = Constraints::parse("-region=ap-south").unwrap();
        assert!(out.allows("us-east", "a") && !out.allows("ap-south", "a"));
    }

    #[test]
    fn the_text_is_canonical_and_round_trips() {
        let c = Constraints::parse("-zone=c,+region=eu-west,-zone=c,-zone=b").unwrap();
        assert_eq!(c.to_string(), "+region=eu-west,-zone=b,-zone=c");
        assert_eq!(Constraints::parse(&c.to_string()).unwrap(), c);
        assert_eq!(Constraints::default().to_string(), "none");
        assert_eq!(
            Constraints::parse("+region=eu-west,-zone=b").unwrap(),
            Constraints::parse("-zone=b, +region=eu-west").unwrap(),
            "order does not matter"
        );
    }

    #[test]
    fn bad_text_is_refused_with_the_reason() {
        let long = format!("+region={}", "x".repeat(MAX_CONSTRAINT_VALUE + 1));
        let many: Vec<String> = (0..=MAX_CONSTRAINTS)
            .map(|i| format!("-zone=z{i}"))
            .collect();
        let cases = [
            ("region=eu-west", "must start with +"),
            ("+region", "not of the form"),
            ("+rack=r1", "attributes are region and zone"),
            ("+region=", "names no value"),
            ("+region=eu west", "may not hold"),
            ("+region=a:b", "may not hold"),
            ("+region=a,+region=b", "cannot both hold"),
            ("+zone=a,-zone=a", "contradicts"),
            (long.as_str(), "longer than"),
            (&many.join(","), "at most 16"),
            ("+region=a,", "must start with +"),
        ];
        for (text, want) in cases {
            let e = Constraints::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert!(Constraints::parse("+region=a,-region=b").is_ok());
    }
}
