//! Validation of a decoded batch: every rule of `acker_service/batch.py`, in the same
//! order, with the same messages, so both engines refuse a bad request identically.
//! A refused batch changes nothing: validation runs before the ledger sees it.

use crate::ledger::{Ops, FAIL, INIT, RESET_TIMEOUT};

/// Longest spout name in bytes (`batch.MAX_SPOUT_NAME_BYTES`).
pub const MAX_SPOUT_NAME_BYTES: usize = 256;

/// Which gRPC status a refusal maps to (the Python exception classes of `batch.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `InvalidBatch`: INVALID_ARGUMENT.
    Invalid,
    /// `BatchTooLarge`: RESOURCE_EXHAUSTED.
    TooLarge,
    /// `WrongShard`: FAILED_PRECONDITION.
    WrongShard,
}

/// A refused batch: the status class and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    /// The status class.
    pub refusal: Refusal,
    /// The message.
    pub message: String,
}

fn invalid(message: String) -> BatchError {
    BatchError {
        refusal: Refusal::Invalid,
        message,
    }
}

/// Where this acker sits in the cluster, and its batch limit.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// This shard's index.
    pub shard_index: u64,
    /// Number of shards.
    pub shard_count: u64,
    /// Most operations per batch.
    pub max_batch: usize,
    /// Replication factor: 1, or 2 (this shard also follows the previous shard's roots).
    pub replicas: u64,
}

/// Python's `repr()` of a str, for messages that quote a spout name as the reference does.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Longest quoted echo of client input in a message (`acker_protocol.text.MAX_ECHO_CHARS`).
const MAX_ECHO_CHARS: usize = 64;

/// `acker_protocol.text.clip`: the repr cut to 64 characters, noting the full length, so that a
/// 64 KiB name cannot overflow the status trailers.
pub fn py_clip(s: &str) -> String {
    let text = py_repr(s);
    if text.chars().count() <= MAX_ECHO_CHARS {
        return text;
    }
    let head: String = text.chars().take(MAX_ECHO_CHARS).collect();
    format!("{head}... ({} characters in all)", s.chars().count())
}

fn kind_name(kind: i32) -> &'static str {
    match kind {
        FAIL => "FAIL",
        RESET_TIMEOUT => "RESET_TIMEOUT",
        _ => "INIT or ACK",
    }
}

/// Return the first problem of the batch, as `batch.validate_batch` would name it.
pub fn validate(ops: &Ops, limits: Limits) -> Result<(), BatchError> {
    let n = ops.kinds.len();
    if n > limits.max_batch {
        let max = limits.max_batch;
        return Err(BatchError {
            refusal: Refusal::TooLarge,
            message: format!(
                "batch has {n} operations, more than this acker's maximum of {max}; \
                 split it into batches of at most {max}"
            ),
        });
    }
    for (name, len) in [("root_ids", ops.roots.len()), ("values", ops.values.len())] {
        if len != n {
            return Err(invalid(format!(
                "kinds has {n} entries but {name} has {len}; the arrays must be parallel"
            )));
        }
    }
    let keys = ops.dedup_keys.len();
    if keys != 0 && keys != n {
        return Err(invalid(format!(
            "dedup_keys has {keys} entries; send none or exactly one per operation ({n})"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    if let Some(i) = ops.kinds.iter().position(|&k| !(INIT..=RESET_TIMEOUT).contains(&k)) {
        return Err(invalid(format!(
            "operation {i} has unknown kind {}; expected INIT (1), ACK (2), FAIL (3) or RESET_TIMEOUT (4)",
            ops.kinds[i]
        )));
    }
    if let Some(i) = ops.roots.iter().position(|&r| r == 0) {
        return Err(invalid(format!(
            "operation {i} has root id 0; root ids must be non-zero"
        )));
    }
    if let Some(i) = (0..n).find(|&i| ops.kinds[i] >= FAIL && ops.values[i] != 0) {
        return Err(invalid(format!(
            "operation {i} is {} with a non-zero value; send 0",
            kind_name(ops.kinds[i])
        )));
    }
    validate_spouts(ops)?;
    check_ownership(ops, limits)
}

/// `batch._check_ownership`: every root is owned by this shard or, with replicas 2, by the one before it.
fn check_ownership(ops: &Ops, limits: Limits) -> Result<(), BatchError> {
    let (count, index, replicas) = (limits.shard_count, limits.shard_index, limits.replicas.max(1));
    if count <= replicas {
        return Ok(()); // every shard keeps every root
    }
    // How far this shard is after the root's owner: 0 = owns it, 1 = follows it.
    let distance = |r: u64| (index + count - r % count) % count;
    match ops.roots.iter().find(|&&r| distance(r) >= replicas) {
        None => Ok(()),
        Some(&root) => {
            let owner = root % count;
            let followers: String = (1..replicas)
                .map(|k| format!(" and shard {}", (owner + k) % count))
                .collect();
            Err(BatchError {
                refusal: Refusal::WrongShard,
                message: format!(
                    "root {root} belongs to shard {owner}{followers} of {count}, but this acker is shard {index}; \
                     check the client's address order"
                ),
            })
        }
    }
}

fn validate_spouts(ops: &Ops) -> Result<(), BatchError> {
    for name in ops.spouts {
        let size = name.len();
        if size == 0 || size > MAX_SPOUT_NAME_BYTES {
            return Err(invalid(format!(
                "spout name {} is {size} bytes; spout names must be 1 to {MAX_SPOUT_NAME_BYTES} bytes",
                py_clip(name)
            )));
        }
    }
    let n = ops.kinds.len();
    let first_init = || ops.kinds.iter().position(|&k| k == INIT);
    if ops.spout_index.is_empty() {
        if ops.spouts.len() > 1 {
            return Err(invalid(format!(
                "{} spouts given but no spout_index; send one spout index per operation",
                ops.spouts.len()
            )));
        }
        if ops.spouts.is_empty() {
            if let Some(i) = first_init() {
                return Err(invalid(format!(
                    "operation {i} is INIT but the request names no spout"
                )));
            }
        }
        return Ok(());
    }
    if ops.spout_index.len() != n {
        return Err(invalid(format!(
            "spout_index has {} entries; send none or exactly one per operation ({n})",
            ops.spout_index.len()
        )));
    }
    let named = ops.spouts.len();
    if let Some(i) = (0..n).find(|&i| ops.kinds[i] == INIT && ops.spout_index[i] as usize >= named) {
        return Err(invalid(format!(
            "operation {i} is INIT with spout index {}, but only {named} spouts are named",
            ops.spout_index[i]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            shard_index: 0,
            shard_count: 1,
            max_batch: 100,
            replicas: 1,
        }
    }

    fn check(kinds: &[i32], roots: &[u64], values: &[u64], spouts: &[String], idx: &[u32]) -> Result<(), BatchError> {
        let ops = Ops {
            kinds,
            roots,
            values,
            dedup_keys: &[],
            spouts,
            spout_index: idx,
        };
        validate(&ops, limits())
    }

    #[test]
    fn valid_batch_passes() {
        let s = vec!["s".to_owned()];
        assert_eq!(check(&[1, 2, 3, 4], &[1, 1, 1, 1], &[5, 5, 0, 0], &s, &[]), Ok(()));
        assert_eq!(check(&[], &[], &[], &[], &[]), Ok(()));
    }

    #[test]
    fn each_rule_names_the_operation() {
        let s = vec!["s".to_owned()];
        let msg = |r: Result<(), BatchError>| r.unwrap_err().message;
        assert!(msg(check(&[1, 9], &[1, 1], &[1, 1], &s, &[])).starts_with("operation 1 has unknown kind 9"));
        assert!(msg(check(&[2, 2], &[1, 0], &[1, 1], &s, &[])).starts_with("operation 1 has root id 0"));
        assert_eq!(msg(check(&[2, 4], &[1, 1], &[1, 1], &s, &[])), "operation 1 is RESET_TIMEOUT with a non-zero value; send 0");
        assert_eq!(msg(check(&[1], &[1], &[1], &[], &[])), "operation 0 is INIT but the request names no spout");
        assert_eq!(
            msg(check(&[2, 1], &[1, 1], &[1, 1], &s, &[0, 3])),
            "operation 1 is INIT with spout index 3, but only 1 spouts are named"
        );
        assert_eq!(msg(check(&[1], &[1, 2], &[1], &s, &[])), "kinds has 1 entries but root_ids has 2; the arrays must be parallel");
    }

    #[test]
    fn wrong_shard_and_too_large() {
        let ops = Ops {
            kinds: &[2, 2],
            roots: &[4, 5],
            values: &[1, 1],
            dedup_keys: &[],
            spouts: &[],
            spout_index: &[],
        };
        let l = Limits {
            shard_index: 0,
            shard_count: 2,
            max_batch: 10,
            replicas: 1,
        };
        let err = validate(&ops, l).unwrap_err();
        assert_eq!(err.refusal, Refusal::WrongShard);
        assert!(err.message.starts_with("root 5 belongs to shard 1 of 2"));
        let err = validate(&ops, Limits { max_batch: 1, ..l }).unwrap_err();
        assert_eq!(err.refusal, Refusal::TooLarge);
    }

    #[test]
    fn replicas_two_accepts_owned_and_followed_roots_only() {
        // Shard 1 of 3 owns roots = 1 (mod 3) and follows roots = 0 (mod 3); roots = 2 are foreign.
        let ops = |roots: &'static [u64]| Ops {
            kinds: &[2, 2],
            roots,
            values: &[1, 1],
            dedup_keys: &[],
            spouts: &[],
            spout_index: &[],
        };
        let l = Limits {
            shard_index: 1,
            shard_count: 3,
            max_batch: 10,
            replicas: 2,
        };
        assert_eq!(validate(&ops(&[4, 6]), l), Ok(()));
        let err = validate(&ops(&[4, 5]), l).unwrap_err();
        assert_eq!(err.refusal, Refusal::WrongShard);
        assert_eq!(
            err.message,
            "root 5 belongs to shard 2 and shard 0 of 3, but this acker is shard 1; check the client's address order"
        );
        // With replicas 1 the followed root is foreign.
        assert!(validate(&ops(&[4, 6]), Limits { replicas: 1, ..l }).is_err());
        // Two shards, two replicas: every shard keeps every root.
        assert_eq!(validate(&ops(&[4, 5]), Limits { shard_count: 2, ..l }), Ok(()));
    }

    #[test]
    fn repr_like_python() {
        assert_eq!(py_repr("abc"), "'abc'");
        assert_eq!(py_repr(""), "''");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\nb\\"), "'a\\nb\\\\'");
    }
}
