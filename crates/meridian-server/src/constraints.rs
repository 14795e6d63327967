//! Replica constraints on the server: where they come from, and what refuses to break them.
//!
//! A data shard's constraints (`meridian_types::constraints`: `+region=eu-west`,
//! `-region=ap-south,-zone=c`) say which members may hold its replicas. They are part of
//! the shard's placement, next to its home region and survival goal (`home`, `survival`),
//! stored in the shard map (`ShardDescriptor::constraints`).
//!
//! - **At bootstrap**: `cluster.replica_constraints` (flag `--replica-constraints`, entries
//!   separated by `;`) lists rules `<start key>:<constraints>`; as with `home_regions`, keys
//!   from a rule's start key up to the next rule's have its constraints, and a shard takes
//!   the rule covering its start key. The founding placement (`ShardMap::with_constraints`)
//!   then chooses the shard's replicas among the members the constraints allow only.
//!   Startup refuses a rule no `replication_factor` members satisfy, a value naming no
//!   member's region or zone (a typo would otherwise constrain nothing), and a home region
//!   the constraints exclude (or, for zone survival, leave fewer than three members in).
//! - **At run time**: `Cluster.SetPlacement` (`meridian cluster placement SHARD ...
//!   --constraints TEXT|none`) stores new constraints after the same checks against the
//!   members of the moment ([`check_placement`]); the shard's replicas may break them at that
//!   moment (the constraints are a goal, as a survival goal is). The CLI's
//!   `Client::place` then moves each breaking replica to an allowed member (add, then remove).
//! - **Every replica added** (`membership::add_replica`, by hand, by a decommission, by a
//!   placement) must go to a member the stored constraints allow ([`refuse_target`]); the
//!   error names the entries the node breaks.
//!
//! # Invariants
//! - Stored constraints always had, when stored, enough allowed members for the shard's
//!   replicas, named only known regions and zones, and allowed the shard's home.
//! - No replica move adds a replica on a member the shard's stored constraints exclude.
//!
//! # Not done yet
//! - No background allocator: replicas that break stored constraints move only when
//!   `meridian cluster placement` runs (it moves them) or by hand; `cluster status` shows
//!   which replicas break them.
//! - A member that joins later is not checked against existing constraints' values: a
//!   `+zone=` naming its zone is refused until it has joined.
//! - The metadata shard takes no constraints (it has no home either).

use crate::config::{ConfigError, Member};
use crate::shard_map::ShardDescriptor;
use crate::survival::{Survival, ZONE_VOTERS};
use meridian_types::constraints::{Attribute, Constraints};

/// Keys from `start` to the next rule's start have `constraints`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintRule {
    pub start: Vec<u8>,
    pub constraints: Constraints,
}

/// Parses and checks `cluster.replica_constraints` against the founding members and the
/// replication factor `rf`; sorted by start key.
pub fn parse_rules(
    raw: &[String],
    members: &[Member],
    rf: usize,
) -> Result<Vec<ConstraintRule>, ConfigError> {
    let mut rules: Vec<ConstraintRule> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.iter().enumerate() {
        let fail = |message: String| ConfigError {
            field: format!("cluster.replica_constraints[{i}]"),
            message,
        };
        let (start, text) = entry.rsplit_once(':').ok_or_else(|| {
            fail(format!(
                "{entry:?} is not of the form <start key>:<constraints>, as in \
                 user5:+region=eu-west,-zone=c"
            ))
        })?;
        let constraints = Constraints::parse(text).map_err(fail)?;
        if constraints.is_empty() {
            return Err(fail(format!("{entry:?} names no constraint")));
        }
        check_members(&constraints, members, rf.min(members.len())).map_err(fail)?;
        if rules.iter().any(|r| r.start == start.as_bytes()) {
            return Err(fail(format!("start key {start:?} is listed twice")));
        }
        rules.push(ConstraintRule {
            start: start.as_bytes().to_vec(),
            constraints,
        });
    }
    rules.sort_by(|a, b| a.start.cmp(&b.start));
    Ok(rules)
}

/// The rule for a shard starting at `start`: the last one starting at or before it.
pub fn rule_of<'r>(rules: &'r [ConstraintRule], start: &[u8]) -> Option<&'r ConstraintRule> {
    let idx = rules.partition_point(|r| r.start.as_slice() <= start);
    idx.checked_sub(1).map(|i| &rules[i])
}

/// Checks that every home rule's region is allowed where constraint rules apply too: at every
/// start key of either list the two rules covering it must agree (between start keys neither
/// changes, so this covers every shard).
pub fn check_homes(
    homes: &[crate::home::HomeRule],
    rules: &[ConstraintRule],
    members: &[Member],
) -> Result<(), ConfigError> {
    let starts = homes
        .iter()
        .map(|h| h.start.as_slice())
        .chain(rules.iter().map(|r| r.start.as_slice()));
    for start in starts {
        let (Some(home), Some(rule)) = (crate::home::rule_of(homes, start), rule_of(rules, start))
        else {
            continue;
        };
        home_allowed(&rule.constraints, &home.region, home.survival, members).map_err(
            |message| ConfigError {
                field: "cluster.replica_constraints".into(),
                message: format!(
                    "keys from {:?} have home {} (cluster.home_regions) and constraints {}: \
                     {message}",
                    String::from_utf8_lossy(start),
                    home.region,
                    rule.constraints
                ),
            },
        )?;
    }
    Ok(())
}

/// Whether `member` may hold a replica under `constraints`.
pub fn admits(constraints: &Constraints, member: &Member) -> bool {
    constraints.allows(&member.region, &member.zone)
}

/// Why shard `desc` may not take a replica on `member` under its stored constraints; `None`
/// if it may.
pub fn refuse_target(desc: &ShardDescriptor, member: &Member) -> Option<String> {
    (!admits(&desc.constraints, member)).then(|| {
        format!(
            "node {} ({}/{}) breaks shard {}'s replica constraints ({}: {}); pick a node they \
             allow, or change them (meridian cluster placement {} ... --constraints)",
            member.node_id,
            member.region,
            member.zone,
            desc.id.0,
            desc.constraints,
            desc.constraints.broken_by(&member.region, &member.zone),
            desc.id.0
        )
    })
}

/// Checks a placement about to be stored for shard `desc`: its `constraints` allow its
/// `home` (three members there under zone survival) and, when they are new (not the shard's
/// stored ones), name known regions and zones of `members` and allow at least as many of
/// them as the shard has replicas. (Stored constraints are not judged again: a home change
/// must not fail because a member was forgotten since.)
pub fn check_placement(
    desc: &ShardDescriptor,
    constraints: &Constraints,
    home: Option<&str>,
    survival: Survival,
    members: &[Member],
) -> Result<(), String> {
    if constraints.is_empty() {
        return Ok(());
    }
    if constraints != &desc.constraints {
        check_members(constraints, members, desc.replicas.len())
            .map_err(|e| format!("shard {}: {e}", desc.id.0))?;
    }
    match home {
        Some(home) => home_allowed(constraints, home, survival, members)
            .map_err(|e| format!("shard {} has home {home}: {e}", desc.id.0)),
        None => Ok(()),
    }
}

/// `constraints` name only values some member has, and allow at least `need` members.
fn check_members(constraints: &Constraints, members: &[Member], need: usize) -> Result<(), String> {
    for c in constraints.entries() {
        let known = |m: &Member| match c.attribute {
            Attribute::Region => m.region == c.value,
            Attribute::Zone => m.zone == c.value,
        };
        if !members.iter().any(known) {
            let mut values: Vec<&str> = members
                .iter()
                .map(|m| match c.attribute {
                    Attribute::Region => m.region.as_str(),
                    Attribute::Zone => m.zone.as_str(),
                })
                .collect();
            values.sort_unstable();
            values.dedup();
            return Err(format!(
                "{c} names a {} no member has ({}s: {})",
                c.attribute.as_str(),
                c.attribute.as_str(),
                values.join(", ")
            ));
        }
    }
    let allowed: Vec<_> = members
        .iter()
        .filter(|m| admits(constraints, m))
        .map(|m| m.node_id)
        .collect();
    if allowed.len() < need {
        return Err(format!(
            "constraints {constraints} allow {} member(s) ({allowed:?}), and {need} replicas \
             need as many",
            allowed.len()
        ));
    }
    Ok(())
}

/// `constraints` allow a member in `home` (three under zone survival).
fn home_allowed(
    constraints: &Constraints,
    home: &str,
    survival: Survival,
    members: &[Member],
) -> Result<(), String> {
    let need = match survival {
        Survival::Zone => ZONE_VOTERS,
        Survival::Region => 1,
    };
    let there = members
        .iter()
        .filter(|m| m.region == home && admits(constraints, m))
        .count();
    if there < need {
        return Err(format!(
            "constraints {constraints} allow {there} member(s) in the home region {home}, and \
             {} survival needs {need} there",
            survival.as_str()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::home::parse_home_regions;
    use crate::shard_map::ShardMap;

    fn members() -> Vec<Member> {
        [
            "1=127.0.0.1:1@us-east/a",
            "2=127.0.0.1:2@eu-west/a",
            "3=127.0.0.1:3@ap-south/a",
            "4=127.0.0.1:4@us-east/b",
            "5=127.0.0.1:5@eu-west/b",
            "6=127.0.0.1:6@us-east/c",
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
        let rules = parse_rules(
            &raw(&["user5:-region=ap-south", ":+region=us-east"]),
            &members(),
            3,
        )
        .unwrap();
        let of = |k: &[u8]| rule_of(&rules, k).map(|r| r.constraints.to_string());
        assert_eq!(of(b"a").as_deref(), Some("+region=us-east"));
        assert_eq!(of(b"user5").as_deref(), Some("-region=ap-south"));
        assert_eq!(of(b"zz").as_deref(), Some("-region=ap-south"));
        let partial = parse_rules(&raw(&["m:-zone=c"]), &members(), 3).unwrap();
        assert!(
            rule_of(&partial, b"a").is_none(),
            "keys before the first rule"
        );
    }

    #[test]
    fn bad_rules_name_their_field_and_reason() {
        let cases = [
            ("+region=eu-west", "is not of the form"),
            ("a:", "names no constraint"),
            ("a:+region=mars", "names a region no member has"),
            ("a:-zone=q", "names a zone no member has"),
            ("a:+region=ap-south", "allow 1 member(s)"),
            ("a:region=eu-west", "must start with +"),
        ];
        for (entry, want) in cases {
            let e = parse_rules(&raw(&[entry]), &members(), 3).unwrap_err();
            assert_eq!(e.field, "cluster.replica_constraints[0]");
            assert!(e.message.contains(want), "{entry}: {e}");
        }
        let e = parse_rules(&raw(&["a:-zone=c", "a:-zone=b"]), &members(), 3).unwrap_err();
        assert!(e.message.contains("listed twice"), "{e}");
        // Two eu-west members are enough for two replicas.
        assert!(parse_rules(&raw(&["a:+region=eu-west"]), &members(), 2).is_ok());
    }

    #[test]
    fn a_home_the_constraints_exclude_is_refused_at_startup() {
        let m = members();
        let homes = parse_home_regions(&raw(&["=us-east", "m=eu-west"]), &m).unwrap();
        let ok = parse_rules(&raw(&[":-region=ap-south"]), &m, 3).unwrap();
        check_homes(&homes, &ok, &m).unwrap();
        let bad = parse_rules(&raw(&["n:-region=eu-west"]), &m, 3).unwrap();
        let e = check_homes(&homes, &bad, &m).unwrap_err();
        assert!(
            e.message.contains("keys from \"n\" have home eu-west")
                && e.message
                    .contains("allow 0 member(s) in the home region eu-west"),
            "{e}"
        );
        let zoned = parse_home_regions(&raw(&["=us-east:zone"]), &m).unwrap();
        let no_c = parse_rules(&raw(&[":-zone=c"]), &m, 3).unwrap();
        let e = check_homes(&zoned, &no_c, &m).unwrap_err();
        assert!(e.message.contains("zone survival needs 3 there"), "{e}");
    }

    #[test]
    fn a_placement_is_checked_against_the_members_of_the_moment() {
        let m = members();
        let map = ShardMap::founding(&m, 3, &[], 2);
        let desc = &map.data[0];
        let c = |t: &str| Constraints::parse(t).unwrap();
        assert!(check_placement(
            desc,
            &c("-region=ap-south"),
            Some("us-east"),
            Survival::Region,
            &m
        )
        .is_ok());
        assert!(check_placement(desc, &Constraints::default(), None, Survival::Region, &m).is_ok());
        let e =
            check_placement(desc, &c("+region=ap-south"), None, Survival::Region, &m).unwrap_err();
        assert!(e.contains("allow 1 member(s) ([3])"), "{e}");
        let e = check_placement(
            desc,
            &c("-region=us-east"),
            Some("us-east"),
            Survival::Region,
            &m,
        )
        .unwrap_err();
        assert!(e.contains("has home us-east"), "{e}");
        let e =
            check_placement(desc, &c("-zone=b"), Some("us-east"), Survival::Zone, &m).unwrap_err();
        assert!(e.contains("zone survival needs 3"), "{e}");
        // Stored constraints are judged against the home only: node 3 forgotten since.
        let mut stored = desc.clone();
        stored.constraints = c("+region=ap-south");
        let without_3: Vec<Member> = m.iter().filter(|x| x.node_id != 3).cloned().collect();
        let same = c("+region=ap-south");
        let e = check_placement(
            &stored,
            &same,
            Some("us-east"),
            Survival::Region,
            &without_3,
        )
        .unwrap_err();
        assert!(
            e.contains("allow 0 member(s) in the home region us-east"),
            "{e}"
        );
        assert!(check_placement(&stored, &same, None, Survival::Region, &without_3).is_ok());
        let e = check_placement(desc, &same, None, Survival::Region, &without_3).unwrap_err();
        assert!(
            e.contains("no member has"),
            "new constraints are judged: {e}"
        );
    }

    #[test]
    fn a_target_the_constraints_exclude_is_refused_with_the_entries_it_breaks() {
        let m = members();
        let mut map = ShardMap::founding(&m, 3, &[], 2);
        map.data[0].constraints = Constraints::parse("-region=ap-south,-zone=b").unwrap();
        let desc = &map.data[0];
        assert_eq!(refuse_target(desc, &m[0]), None);
        let e = refuse_target(desc, &m[2]).unwrap();
        assert!(
            e.contains("node 3 (ap-south/a)") && e.contains(": -region=ap-south)"),
            "{e}"
        );
        let e = refuse_target(desc, &m[3]).unwrap();
        assert!(e.contains(": -zone=b)"), "{e}");
    }
}
