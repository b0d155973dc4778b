//! The `ApplyRequest` message of `proto/acker_protocol/v1/acker.proto` (the core only decodes requests: the
//! Python servicer writes the `ApplyResponse`).
//!
//! Written with prost's derive macros instead of generated from the .proto (the build
//! needs no `protoc`); a Python test decodes messages encoded by the generated Python
//! code, field by field, so a drift from the .proto fails there.

use prost::Message;

use crate::ledger::Ops;

/// `acker_service.v1.ApplyRequest`: parallel packed arrays, one entry per operation.
#[derive(Clone, PartialEq, Message)]
pub struct ApplyRequest {
    /// `repeated OpKind kinds = 1` (an enum is an int32 on the wire; unknown values are kept).
    #[prost(int32, repeated, tag = "1")]
    pub kinds: Vec<i32>,
    /// `repeated fixed64 root_ids = 2`.
    #[prost(fixed64, repeated, tag = "2")]
    pub root_ids: Vec<u64>,
    /// `repeated fixed64 values = 3`.
    #[prost(fixed64, repeated, tag = "3")]
    pub values: Vec<u64>,
    /// `repeated fixed64 dedup_keys = 4`.
    #[prost(fixed64, repeated, tag = "4")]
    pub dedup_keys: Vec<u64>,
    /// `repeated string spouts = 5`.
    #[prost(string, repeated, tag = "5")]
    pub spouts: Vec<String>,
    /// `repeated uint32 spout_index = 6`.
    #[prost(uint32, repeated, tag = "6")]
    pub spout_index: Vec<u32>,
}

impl ApplyRequest {
    /// The request's arrays as the ledger's and the validator's view of a batch.
    pub fn ops(&self) -> Ops<'_> {
        Ops {
            kinds: &self.kinds,
            roots: &self.root_ids,
            values: &self.values,
            dedup_keys: &self.dedup_keys,
            spouts: &self.spouts,
            spout_index: &self.spout_index,
        }
    }
}

/// Decode request bytes; the error says what is wrong with them, for INVALID_ARGUMENT.
pub fn decode_apply_request(data: &[u8]) -> Result<ApplyRequest, String> {
    ApplyRequest::decode(data).map_err(|e| {
        format!(
            "the request is not a valid acker_service.v1.ApplyRequest ({e}); \
             send a message encoded from proto/acker_protocol/v1/acker.proto"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_field() {
        let req = ApplyRequest {
            kinds: vec![1, 2, 4, 77, -3],
            root_ids: vec![u64::MAX, 1],
            values: vec![5],
            dedup_keys: vec![9, 0],
            spouts: vec!["a".into(), "é".into()],
            spout_index: vec![0, 1, 70000],
        };
        assert_eq!(decode_apply_request(&req.encode_to_vec()).unwrap(), req);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [&b"\xff\xff\xff"[..], b"\x12\x05\x01", b"\x2a\x02\xc3\x28", b"\x0a\xff\xff\xff\xff\x0f"] {
            let err = decode_apply_request(bad).unwrap_err();
            assert!(err.contains("not a valid acker_service.v1.ApplyRequest"), "{err}");
        }
    }

    /// Random and mutated buffers: decoding and validating never panics (a cheap stand-in
    /// for a fuzzer; `cargo fuzz` needs a nightly toolchain this project does not assume).
    #[test]
    fn random_bytes_never_panic() {
        use crate::validate::{validate, Limits};
        let valid = ApplyRequest {
            kinds: vec![1, 2, 3],
            root_ids: vec![5, 6, 7],
            values: vec![1, 1, 0],
            dedup_keys: vec![],
            spouts: vec!["s".into()],
            spout_index: vec![0, 0, 0],
        }
        .encode_to_vec();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let limits = Limits {
            shard_index: 1,
            shard_count: 3,
            max_batch: 2,
            replicas: 2,
        };
        for round in 0..50_000 {
            let buf: Vec<u8> = if round % 2 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect()
            } else {
                let mut b = valid.clone();
                for _ in 0..1 + next() % 3 {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                b
            };
            if let Ok(req) = decode_apply_request(&buf) {
                let ops = req.ops();
                let _ = validate(&ops, limits);
            }
        }
    }
}
