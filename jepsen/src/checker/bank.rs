//! The bank checker: a fixed total of money moved between accounts by transactions.
//!
//! # What
//! Clients transfer amounts between accounts (`transfer`) and read every account in one
//! read-only transaction (`read_all` on the bank's key, value `{account: balance}`). If
//! transactions are atomic and serializable, every successful read sees the same set of
//! accounts, no negative balance (transfers never overdraw), and balances summing to the
//! initial total. Each violation is an anomaly naming the read:
//! - `wrong-total`: the balances do not sum to the total (a lost or half-applied transfer, or
//!   a read that mixed states);
//! - `negative`: a balance below zero (a lost update: two transfers both spent the same money);
//! - `accounts`: an account missing, an unexpected one, or a balance that is not an integer.
//!
//! Transfers' own outcomes do not matter to the invariant (an indeterminate transfer either
//! happened or not; both keep the total), so they are only counted.
//!
//! # Not checked
//! Real-time order and serializability beyond the invariant (the `append` workload's job).

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{History, OpFn, OpKind};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;

/// What the bank started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BankModel {
    /// The bank's key in the history (`read_all` and `transfer` ops carry it).
    pub key: String,
    pub accounts: BTreeSet<String>,
    pub total: i64,
}

/// The bank checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BankReport {
    pub reads_ok: usize,
    pub reads_failed: usize,
    pub transfers_ok: usize,
    pub transfers_failed: usize,
    pub transfers_indeterminate: usize,
    #[serde(skip)]
    pub anomalies: Vec<Anomaly>,
}

impl BankReport {
    /// The common result: invalid with any anomaly; unknown if no read succeeded (nothing was
    /// checked).
    pub fn to_check_result(&self) -> CheckResult {
        super::counted_result(
            "bank",
            self.anomalies.clone(),
            self.reads_ok,
            "no read of the accounts succeeded: nothing was checked",
            serde_json::to_value(self).unwrap_or(Value::Null),
        )
    }
}

/// Checks every successful read of `model`'s bank in `history`.
pub fn check_bank(history: &History, model: &BankModel) -> Result<BankReport, CheckError> {
    let mut report = BankReport::default();
    for pair in history.pairs()? {
        let invoke = &history.ops[pair.invoke];
        if invoke.key.as_deref() != Some(model.key.as_str()) {
            continue;
        }
        match (invoke.f, pair.outcome) {
            (OpFn::Transfer, OpKind::Ok) => report.transfers_ok += 1,
            (OpFn::Transfer, OpKind::Fail) => report.transfers_failed += 1,
            (OpFn::Transfer, _) => report.transfers_indeterminate += 1,
            (OpFn::ReadAll, OpKind::Ok) => {
                report.reads_ok += 1;
                let index = pair.completion.expect("an ok op has a completion");
                let ops = vec![pair.invoke, index];
                if let Some(anomaly) = check_read(&history.ops[index].value, model, ops) {
                    report.anomalies.push(anomaly);
                }
            }
            (OpFn::ReadAll, _) => report.reads_failed += 1,
            _ => {}
        }
    }
    Ok(report)
}

fn check_read(value: &Value, model: &BankModel, ops: Vec<usize>) -> Option<Anomaly> {
    let anomaly = |kind: &str, message: String| {
        Some(Anomaly {
            kind: kind.into(),
            key: Some(model.key.clone()),
            ops: ops.clone(),
            message,
        })
    };
    let Some(balances) = value.as_object() else {
        return anomaly(
            "accounts",
            format!("the read returned {value}, not an object"),
        );
    };
    let seen: BTreeSet<String> = balances.keys().cloned().collect();
    if seen != model.accounts {
        return anomaly(
            "accounts",
            format!(
                "the read saw accounts {seen:?}, the bank has {:?}",
                model.accounts
            ),
        );
    }
    let mut total = 0i64;
    for (account, balance) in balances {
        let Some(balance) = balance.as_i64() else {
            return anomaly(
                "accounts",
                format!("{account} holds {balance}, not an integer"),
            );
        };
        if balance < 0 {
            return anomaly("negative", format!("{account} holds {balance}"));
        }
        total = total.saturating_add(balance);
    }
    if total != model.total {
        return anomaly(
            "wrong-total",
            format!("the balances sum to {total}, not {}: {value}", model.total),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Validity;
    use serde_json::json;

    fn model() -> BankModel {
        BankModel {
            key: "bank".into(),
            accounts: ["a", "b"].iter().map(|s| s.to_string()).collect(),
            total: 20,
        }
    }

    fn history(reads: &[Value]) -> History {
        let mut h = History::new();
        h.invoke(
            0,
            OpFn::Transfer,
            Some("bank"),
            json!({"from": "a", "to": "b", "amount": 3}),
        );
        h.complete(0, OpKind::Info, Value::Null);
        for read in reads {
            h.invoke(1, OpFn::ReadAll, Some("bank"), Value::Null);
            h.complete(1, OpKind::Ok, read.clone());
        }
        h.invoke(2, OpFn::ReadAll, Some("bank"), Value::Null);
        h.complete(2, OpKind::Fail, Value::Null);
        h
    }

    #[test]
    fn reads_that_keep_the_total_are_valid() {
        let r = check_bank(
            &history(&[json!({"a": 10, "b": 10}), json!({"a": 0, "b": 20})]),
            &model(),
        )
        .unwrap();
        assert_eq!(
            r.to_check_result().valid,
            Validity::True,
            "{:?}",
            r.anomalies
        );
        assert_eq!(
            (r.reads_ok, r.reads_failed, r.transfers_indeterminate),
            (2, 1, 1)
        );
    }

    #[test]
    fn each_violation_is_an_anomaly() {
        for (read, kind) in [
            (json!({"a": 10, "b": 11}), "wrong-total"),
            (json!({"a": -1, "b": 21}), "negative"),
            (json!({"a": 20}), "accounts"),
            (json!({"a": 10, "b": 10, "c": 0}), "accounts"),
            (json!({"a": "10", "b": 10}), "accounts"),
            (json!([10, 10]), "accounts"),
        ] {
            let r = check_bank(
                &history(&[json!({"a": 10, "b": 10}), read.clone()]),
                &model(),
            )
            .unwrap();
            let result = r.to_check_result();
            assert_eq!(result.valid, Validity::False, "{read}");
            assert_eq!(result.anomalies[0].kind, kind, "{read}");
            assert_eq!(
                result.anomalies[0].ops,
                vec![4, 5],
                "{read}: the read's invoke and completion"
            );
        }
    }

    #[test]
    fn no_successful_read_is_unknown() {
        let r = check_bank(&history(&[]), &model()).unwrap();
        assert_eq!(r.to_check_result().valid, Validity::Unknown);
    }
}
