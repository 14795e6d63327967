//! Home regions: which region should lead each key range.
//!
//! A shard whose replicas sit in three regions commits a write after a round trip from its
//! leader to the nearest other replica; a client in the leader's region pays that, a client
//! elsewhere pays its own trip to the leader on top. Data mostly used from one region should
//! therefore be *led* from there. `cluster.home_regions` (flag `--home-regions`) lists rules
//! `<start key>=<region>`: keys from the start key up to the next rule's start key have that
//! home region. A shard takes the home of the rule covering its start key; keys before the
//! first rule have none (their leaders stay spread over the cluster).
//!
//! ```toml
//! [cluster]
//! home_regions = ["=us-east", "user5=eu-west", "user7=ap-south"]
//! ```
//!
//! What a home does:
//! - **Placement**: the shard's first replica in placement order (the one that bootstraps the
//!   group, so usually its first leader) is a node of the home region, if one holds a replica.
//! - **Leaders follow** (`leader_follow`): a node leading a shard from outside its home hands
//!   leadership to a caught-up voter in the home region with openraft's cooperative
//!   `transfer_leader`, rate-limited, so after a failover the leader returns home once the
//!   home replica is back.
//!
//! # Invariants
//! - Rules are sorted by start key, start keys are distinct, and every region names a region of
//!   some founding member (checked at startup: a typo fails with the field named).
//! - Every founding member must be given the same rules, as with `initial_cluster`; members
//!   that disagree place and move leaders differently, which costs transfers but never safety
//!   (Raft elects whoever it elects; a transfer is only a hint).
//!
//! # Not done yet
//! - Rules are fixed at startup (no `meridian cluster placement` at run time).
//! - Replica placement ignores the home beyond the first replica (no zone-survival mode with
//!   all voters in the home region), and followers outside the home campaign as early as any.

use crate::config::{ConfigError, Member};

/// Keys from `start` (inclusive) to the next rule's start have `region` as home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeRule {
    pub start: Vec<u8>,
    pub region: String,
}

/// Parses and checks `cluster.home_regions` against the founding members' regions.
pub fn parse_home_regions(
    raw: &[String],
    members: &[Member],
) -> Result<Vec<HomeRule>, ConfigError> {
    let mut rules: Vec<HomeRule> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.iter().enumerate() {
        let field = format!("cluster.home_regions[{i}]");
        let fail = |message: String| ConfigError {
            field: field.clone(),
            message,
        };
        let (start, region) = entry
            .rsplit_once('=')
            .ok_or_else(|| fail(format!("{entry:?} is not of the form <start key>=<region>")))?;
        let region = region.trim();
        if region.is_empty() {
            return Err(fail(format!("{entry:?} names no region")));
        }
        if !members.iter().any(|m| m.region == region) {
            let mut known: Vec<&str> = members.iter().map(|m| m.region.as_str()).collect();
            known.sort_unstable();
            known.dedup();
            return Err(fail(format!(
                "region {region:?} has no founding member (regions: {})",
                known.join(", ")
            )));
        }
        if rules.iter().any(|r| r.start == start.as_bytes()) {
            return Err(fail(format!("start key {start:?} is listed twice")));
        }
        rules.push(HomeRule {
            start: start.as_bytes().to_vec(),
            region: region.to_string(),
        });
    }
    rules.sort_by(|a, b| a.start.cmp(&b.start));
    Ok(rules)
}

/// The home region of a shard starting at `start`: the last rule starting at or before it.
pub fn home_of<'r>(rules: &'r [HomeRule], start: &[u8]) -> Option<&'r str> {
    let idx = rules.partition_point(|r| r.start.as_slice() <= start);
    idx.checked_sub(1).map(|i| rules[i].region.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<Member> {
        [
            "1=127.0.0.1:1@us-east/a",
            "2=127.0.0.1:2@eu-west/a",
            "3=127.0.0.1:3@ap-south/a",
        ]
        .iter()
        .map(|s| Member::parse(s).unwrap())
        .collect()
    }

    fn raw(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rules_cover_from_their_start_to_the_next() {
        let rules = parse_home_regions(
            &raw(&["user5=eu-west", "=us-east", "user7=ap-south"]),
            &members(),
        )
        .unwrap();
        assert_eq!(home_of(&rules, b""), Some("us-east"));
        assert_eq!(home_of(&rules, b"user4999"), Some("us-east"));
        assert_eq!(home_of(&rules, b"user5"), Some("eu-west"));
        assert_eq!(home_of(&rules, b"user6"), Some("eu-west"));
        assert_eq!(home_of(&rules, b"user7"), Some("ap-south"));
        assert_eq!(home_of(&rules, b"zzz"), Some("ap-south"));
        let partial = parse_home_regions(&raw(&["m=eu-west"]), &members()).unwrap();
        assert_eq!(
            home_of(&partial, b"a"),
            None,
            "keys before the first rule have no home"
        );
        assert_eq!(home_of(&[], b"a"), None);
    }

    #[test]
    fn bad_rules_name_their_field() {
        let cases = [
            (raw(&["eu-west"]), "is not of the form"),
            (raw(&["a="]), "names no region"),
            (raw(&["a=mars"]), "has no founding member"),
            (raw(&["a=eu-west", "a=us-east"]), "listed twice"),
        ];
        for (entries, want) in cases {
            let e = parse_home_regions(&entries, &members()).unwrap_err();
            assert!(e.field.starts_with("cluster.home_regions["), "{e}");
            assert!(e.message.contains(want), "{entries:?}: {e}");
        }
    }
}
