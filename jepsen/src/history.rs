//! The history model: what the harness records and every checker reads.
//!
//! # What
//! A [`History`] is the ordered list of [`Op`]s a Jepsen-style test observed, in the shape Jepsen
//! uses: every client operation appears twice, once when a client process *invokes* it
//! ([`OpKind::Invoke`]) and once when the process learns its outcome ([`OpKind::Ok`],
//! [`OpKind::Fail`] or [`OpKind::Info`]). The order of the vector is the real-time order in which
//! the harness observed those events, and it is the order the checkers reason about: if op A's
//! completion precedes op B's invocation in the vector, A happened before B.
//!
//! # Why
//! Checkers need exactly three facts about an operation: when it was invoked, when (and whether)
//! it completed, and what it did. Recording raw events and pairing them afterwards keeps the
//! recorder trivial (append under a lock) and makes the file format the one everyone knows.
//!
//! # Conventions for `value`
//! `value` is a [`serde_json::Value`]:
//! - `Read`: null on invoke; on `Ok`, the value read (null when the key was absent).
//! - `Write`: the value written, on invoke and (usually) repeated on completion.
//! - `Cas`: the array `[expected, new]`; an `Ok` CAS succeeded, a `Fail` CAS did not apply.
//! - `Add`: the element inserted (elements are unique within a set).
//! - `ReadAll`: null on invoke; on `Ok`, an array with every element of the set.
//!
//! # Invariants ([`History::validate`])
//! - `ops[i].index == i`;
//! - a process has at most one outstanding operation: no two invokes in a row by one process,
//!   and no completion without a preceding invoke by the same process;
//! - a completion has the same `f` and `key` as its invoke and no earlier `time_ns`.
//!
//! An invoke never completed (the client crashed, or the run ended) is treated as `Info`: the
//! operation may or may not have taken effect. Jepsen clients retire a process after an `Info`;
//! this model allows but does not require that.
//!
//! # File format
//! `history.jsonl`: one op per line, as JSON. Blank lines are ignored; a malformed line is
//! reported with its 1-based line number.
//!
//! # Not done yet
//! Transactional ops (lists of micro-ops for bank/append/Elle) are not modelled; they will add
//! `OpFn` variants and a `Value` convention, not a new history shape.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which of the two events of an operation, and for a completion, its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A client process started the operation.
    Invoke,
    /// The operation definitely took effect (and, for reads, returned `value`).
    Ok,
    /// The operation definitely did not take effect.
    Fail,
    /// Indeterminate: the operation may or may not have taken effect (timeout, lost connection).
    Info,
}

/// The operation's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpFn {
    /// Register read.
    Read,
    /// Register write (blind overwrite).
    Write,
    /// Register compare-and-set; `value` is `[expected, new]`.
    Cas,
    /// Set insert of a unique element.
    Add,
    /// Read of the whole set, or (bank) of every account; for the bank, `value` is an object
    /// `{account: balance}`.
    ReadAll,
    /// Bank transfer; `value` is `{"from": account, "to": account, "amount": n}`.
    Transfer,
    /// A list-append transaction; `value` is its micro-operations (see `checker::append`).
    Txn,
}

impl fmt::Display for OpFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            OpFn::Read => "read",
            OpFn::Write => "write",
            OpFn::Cas => "cas",
            OpFn::Add => "add",
            OpFn::ReadAll => "read_all",
            OpFn::Transfer => "transfer",
            OpFn::Txn => "txn",
        };
        f.write_str(s)
    }
}

/// One event of a history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history.
    pub index: usize,
    /// Client process id; a process runs one operation at a time.
    pub process: u64,
    /// Invoke, or the completion's outcome.
    pub kind: OpKind,
    /// What the operation does.
    pub f: OpFn,
    /// The register or set the operation targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// See the module docs for the per-`f` convention.
    #[serde(default)]
    pub value: Value,
    /// Monotonic nanoseconds since the start of the run.
    pub time_ns: u64,
    /// Wall-clock milliseconds since the Unix epoch (for correlating with node logs).
    #[serde(default)]
    pub wall_ms: u64,
    /// The node that served the operation, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Error text for `Fail`/`Info` completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    /// An op with the given identity and null value, zero times and no node or error.
    pub fn new(process: u64, kind: OpKind, f: OpFn, key: Option<&str>, value: Value) -> Op {
        Op {
            index: 0,
            process,
            kind,
            f,
            key: key.map(str::to_owned),
            value,
            time_ns: 0,
            wall_ms: 0,
            node: None,
            error: None,
        }
    }

    /// For a `Cas` op, its `(expected, new)` pair; `None` if `value` is not a 2-element array.
    pub fn cas_values(&self) -> Option<(&Value, &Value)> {
        match &self.value {
            Value::Array(a) if a.len() == 2 => Some((&a[0], &a[1])),
            _ => None,
        }
    }
}

/// An invocation paired with its completion (see [`History::pairs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpPair {
    /// History index of the invoke.
    pub invoke: usize,
    /// History index of the completion; `None` if the op never completed.
    pub completion: Option<usize>,
    /// `Ok`, `Fail` or `Info` (`Info` also for an op that never completed).
    pub outcome: OpKind,
}

/// Why a history could not be read or is not well formed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file could not be read or written.
    #[error("history file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a JSON Lines history is not a valid op.
    #[error("history line {line}: {message}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// `ops[position].index != position`.
    #[error("op at position {position} has index {index}")]
    IndexMismatch {
        /// Where the op is.
        position: usize,
        /// What it claims.
        index: usize,
    },
    /// A completion by a process with no outstanding invoke.
    #[error("op {index}: completion by process {process}, which has no outstanding invoke")]
    CompletionWithoutInvoke {
        /// The completion.
        index: usize,
        /// Its process.
        process: u64,
    },
    /// A process invoked while its previous op was still outstanding.
    #[error("op {index}: process {process} invokes while op {outstanding} is still outstanding")]
    DoubleInvoke {
        /// The second invoke.
        index: usize,
        /// Its process.
        process: u64,
        /// The outstanding invoke.
        outstanding: usize,
    },
    /// A completion does not match its invoke.
    #[error("op {index}: completion does not match invoke {invoke}: {reason}")]
    MismatchedCompletion {
        /// The completion.
        index: usize,
        /// Its invoke.
        invoke: usize,
        /// What differs.
        reason: String,
    },
}

/// A recorded history, in observation order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct History {
    /// The events; `ops[i].index == i` in a well-formed history.
    pub ops: Vec<Op>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Wraps `ops` as they are (indices are not rewritten; see [`History::validate`]).
    pub fn from_ops(ops: Vec<Op>) -> History {
        History { ops }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Appends `op`, setting its `index`; returns that index.
    pub fn push(&mut self, mut op: Op) -> usize {
        op.index = self.ops.len();
        self.ops.push(op);
        self.ops.len() - 1
    }

    /// Test/builder helper: appends an invoke at the next nanosecond.
    pub fn invoke(&mut self, process: u64, f: OpFn, key: Option<&str>, value: Value) -> usize {
        let mut op = Op::new(process, OpKind::Invoke, f, key, value);
        op.time_ns = self.next_time();
        self.push(op)
    }

    /// Test/builder helper: appends a completion by `process` at the next nanosecond, copying
    /// `f` and `key` from the process's last op (a stray completion gets `Read`, no key).
    pub fn complete(&mut self, process: u64, kind: OpKind, value: Value) -> usize {
        let last = self.ops.iter().rev().find(|o| o.process == process);
        let (f, key) = last.map_or((OpFn::Read, None), |o| (o.f, o.key.clone()));
        let mut op = Op::new(process, kind, f, None, value);
        op.key = key;
        op.time_ns = self.next_time();
        self.push(op)
    }

    fn next_time(&self) -> u64 {
        self.ops.last().map_or(0, |o| o.time_ns + 1)
    }

    /// Checks the invariants listed in the module docs.
    pub fn validate(&self) -> Result<(), HistoryError> {
        self.pairs().map(|_| ())
    }

    /// Pairs each invoke with its completion, in invoke order, validating along the way.
    /// An invoke with no completion is reported with `completion: None, outcome: Info`.
    pub fn pairs(&self) -> Result<Vec<OpPair>, HistoryError> {
        let mut outstanding: HashMap<u64, usize> = HashMap::new();
        let mut pairs: Vec<OpPair> = Vec::new();
        // Position in `pairs` of each outstanding invoke, so completions fill in their pair.
        let mut slot: HashMap<usize, usize> = HashMap::new();
        for (position, op) in self.ops.iter().enumerate() {
            if op.index != position {
                return Err(HistoryError::IndexMismatch {
                    position,
                    index: op.index,
                });
            }
            match op.kind {
                OpKind::Invoke => {
                    if let Some(&prev) = outstanding.get(&op.process) {
                        return Err(HistoryError::DoubleInvoke {
                            index: position,
                            process: op.process,
                            outstanding: prev,
                        });
                    }
                    outstanding.insert(op.process, position);
                    slot.insert(position, pairs.len());
                    pairs.push(OpPair {
                        invoke: position,
                        completion: None,
                        outcome: OpKind::Info,
                    });
                }
                kind => {
                    let Some(inv) = outstanding.remove(&op.process) else {
                        return Err(HistoryError::CompletionWithoutInvoke {
                            index: position,
                            process: op.process,
                        });
                    };
                    let invoke = &self.ops[inv];
                    let mismatch = if invoke.f != op.f {
                        Some(format!("f {} vs {}", invoke.f, op.f))
                    } else if invoke.key != op.key {
                        Some(format!("key {:?} vs {:?}", invoke.key, op.key))
                    } else if op.time_ns < invoke.time_ns {
                        Some(format!(
                            "time_ns {} before invoke's {}",
                            op.time_ns, invoke.time_ns
                        ))
                    } else {
                        None
                    };
                    if let Some(reason) = mismatch {
                        return Err(HistoryError::MismatchedCompletion {
                            index: position,
                            invoke: inv,
                            reason,
                        });
                    }
                    let p = &mut pairs[slot[&inv]];
                    p.completion = Some(position);
                    p.outcome = kind;
                }
            }
        }
        Ok(pairs)
    }

    /// Parses a JSON Lines history (one op per line; blank lines ignored).
    pub fn from_jsonl_str(text: &str) -> Result<History, HistoryError> {
        let mut ops = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let op: Op = serde_json::from_str(line).map_err(|e| HistoryError::Parse {
                line: i + 1,
                message: e.to_string(),
            })?;
            ops.push(op);
        }
        Ok(History { ops })
    }

    /// Serializes as JSON Lines, one op per line, with a trailing newline.
    pub fn to_jsonl_string(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            out.push_str(&serde_json::to_string(op).expect("an Op always serializes"));
            out.push('\n');
        }
        out
    }

    /// Reads a `history.jsonl` file.
    pub fn read_jsonl(path: impl AsRef<Path>) -> Result<History, HistoryError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| HistoryError::Io {
            path: path.display().to_string(),
            source,
        })?;
        History::from_jsonl_str(&text)
    }

    /// Writes a `history.jsonl` file.
    pub fn write_jsonl(&self, path: impl AsRef<Path>) -> Result<(), HistoryError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_jsonl_string()).map_err(|source| HistoryError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
