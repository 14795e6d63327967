//! Checkers: functions from a [`History`](crate::history::History) to a verdict.
//!
//! # What
//! Every checker produces its own typed report (e.g.
//! [`LinearizabilityReport`](linearizable::LinearizabilityReport),
//! [`SetReport`](set::SetReport)) and converts it into the common [`CheckResult`], which is what
//! the harness writes to `results.json`:
//!
//! ```json
//! {"checker": "set", "valid": false,
//!  "anomalies": [{"kind": "lost", "key": "s", "ops": [12, 40, 97], "message": "..."}],
//!  "stats": {"ok_count": 310, "lost": 1, ...}}
//! ```
//!
//! # Why three-valued
//! A search-based checker can run out of budget. Reporting that as `true` would hide bugs and as
//! `false` would cry wolf, so [`Validity`] has a third value, serialized as the string
//! `"unknown"`. Combining verdicts ([`Validity::and`]): any `false` wins, then any `"unknown"`.
//!
//! # Invariants
//! - `valid == False` implies at least one anomaly; each anomaly lists the history indices that
//!   prove it (invokes and completions), so a reader can find them in `history.jsonl`.
//! - A checker never mutates the history and never returns `True` for a history it did not fully
//!   examine.
//!

pub mod append;
pub mod bank;
pub mod linearizable;
mod search;
pub mod set;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::history::HistoryError;

/// A checker's verdict: valid, invalid, or could not decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Validity {
    /// The history satisfies the property.
    True,
    /// The history violates the property; see the anomalies.
    False,
    /// The checker could not decide (e.g. its search budget ran out).
    Unknown,
}

impl Validity {
    /// `True` or `False`.
    pub fn from_bool(valid: bool) -> Validity {
        if valid {
            Validity::True
        } else {
            Validity::False
        }
    }

    /// Conjunction: `False` if either is, else `Unknown` if either is, else `True`.
    pub fn and(self, other: Validity) -> Validity {
        match (self, other) {
            (Validity::False, _) | (_, Validity::False) => Validity::False,
            (Validity::Unknown, _) | (_, Validity::Unknown) => Validity::Unknown,
            _ => Validity::True,
        }
    }

    /// Whether this is `True`.
    pub fn is_true(self) -> bool {
        self == Validity::True
    }
}

impl Serialize for Validity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Validity::True => s.serialize_bool(true),
            Validity::False => s.serialize_bool(false),
            Validity::Unknown => s.serialize_str("unknown"),
        }
    }
}

impl<'de> Deserialize<'de> for Validity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Validity, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Bool(b) => Ok(Validity::from_bool(b)),
            serde_json::Value::String(s) if s == "unknown" => Ok(Validity::Unknown),
            other => Err(serde::de::Error::custom(format!(
                "expected true, false or \"unknown\", got {other}"
            ))),
        }
    }
}

/// One thing the checker found wrong, with the ops that prove it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anomaly {
    /// Machine-readable category, e.g. `"nonlinearizable"`, `"lost"`, `"unexpected"`.
    pub kind: String,
    /// The key (register or set) concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// History indices of the ops involved (invokes and completions).
    pub ops: Vec<usize>,
    /// A sentence for humans.
    pub message: String,
}

/// The common, serializable result of any checker (one entry of `results.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Which checker produced it (`"linearizable"`, `"set"`).
    pub checker: String,
    /// The verdict.
    pub valid: Validity,
    /// What is wrong (empty when valid). Indeterminate results explain themselves here too,
    /// with kinds such as `"unknown"`.
    pub anomalies: Vec<Anomaly>,
    /// Checker-specific statistics and witnesses (the checker's report, serialized).
    pub stats: serde_json::Value,
}

/// The result of a checker that examined `checked` items: invalid with any anomaly, unknown
/// (with an `unknown` anomaly saying `why_unknown`) if it examined none, else valid.
pub(crate) fn counted_result(
    checker: &str,
    mut anomalies: Vec<Anomaly>,
    checked: usize,
    why_unknown: &str,
    stats: serde_json::Value,
) -> CheckResult {
    let valid = if !anomalies.is_empty() {
        Validity::False
    } else if checked == 0 {
        anomalies.push(Anomaly {
            kind: "unknown".into(),
            key: None,
            ops: vec![],
            message: why_unknown.into(),
        });
        Validity::Unknown
    } else {
        Validity::True
    };
    CheckResult {
        checker: checker.into(),
        valid,
        anomalies,
        stats,
    }
}

/// The verdict of several checkers together (see [`Validity::and`]); `True` for none.
pub fn overall(results: &[CheckResult]) -> Validity {
    results.iter().fold(Validity::True, |v, r| v.and(r.valid))
}

/// Why a checker could not run at all (as opposed to finding the history invalid).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The history is not well formed.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// An op does not follow the `value` conventions of its `f`.
    #[error("op {index}: {reason}")]
    Malformed {
        /// History index of the offending op.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Canonical text of a JSON value, usable as a hash key (object keys are sorted by serde_json's
/// default map, so equal values give equal text).
pub(crate) fn value_key(v: &serde_json::Value) -> String {
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validity serializes as true / false / "unknown" and parses back.
    #[test]
    fn validity_json_shape() {
        for (v, text) in [
            (Validity::True, "true"),
            (Validity::False, "false"),
            (Validity::Unknown, "\"unknown\""),
        ] {
            assert_eq!(serde_json::to_string(&v).unwrap(), text);
            assert_eq!(serde_json::from_str::<Validity>(text).unwrap(), v);
        }
        assert!(serde_json::from_str::<Validity>("\"maybe\"").is_err());
    }

    /// Combining verdicts: false dominates unknown, which dominates true.
    #[test]
    fn validity_and_and_overall() {
        use Validity::*;
        assert_eq!(True.and(True), True);
        assert_eq!(True.and(Unknown), Unknown);
        assert_eq!(Unknown.and(False), False);
        let r = |valid| CheckResult {
            checker: "x".into(),
            valid,
            anomalies: vec![],
            stats: serde_json::Value::Null,
        };
        assert_eq!(overall(&[]), True);
        assert_eq!(overall(&[r(True), r(Unknown)]), Unknown);
        assert_eq!(overall(&[r(Unknown), r(False), r(True)]), False);
    }
}
