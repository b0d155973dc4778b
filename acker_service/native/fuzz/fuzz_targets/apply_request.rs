//! Untrusted `ApplyRequest` bytes through the whole native hot path: decode, validate
//! (as shard 0 of 1 and of 2), apply what is valid, then expire everything. Nothing may
//! panic, and the ledger's conservation law must hold after each step.
#![no_main]

use _native::ledger::{BatchOutput, Ledger, Outcomes};
use _native::validate::{validate, Limits};
use _native::wire::decode_apply_request;
use libfuzzer_sys::fuzz_target;

/// Every applied INIT is pending or ended in exactly one outcome.
fn assert_conserved(ledger: &Ledger) {
    let s = ledger.stats();
    assert_eq!(s.inits, s.acked + s.failed + s.timed_out + ledger.pending_trees());
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode_apply_request(data) else {
        return;
    };
    let ops = req.ops();
    for shard_count in [1, 2] {
        let limits = Limits { shard_index: 0, shard_count, max_batch: 65_536, replicas: 1 };
        if validate(&ops, limits).is_err() {
            continue;
        }
        let mut ledger = Ledger::new(30.0, 3, 0.0, 7).expect("a valid configuration");
        // Twice: the second copy exercises set-once init, dedup keys and ended trees.
        for now in [1.0, 2.0] {
            let mut out = BatchOutput::default();
            if ledger.apply(&ops, now, &mut out).is_ok() {
                assert_conserved(&ledger);
            }
        }
        let mut expired = Outcomes::default();
        ledger.advance(1_000.0, &mut expired);
        assert_eq!(ledger.pending_trees(), 0, "every tree expires by T + T/(b-1)");
        assert_conserved(&ledger);
    }
});
