//! The acker's native core: a columnar ledger with the semantics of the reference
//! Python ledger (`acker_service/reference_ledger.py`), the `ApplyRequest` decoder
//! and its validation, and a thin PyO3 binding (`acker_service._native`).
//!
//! Everything except `binding` is pure Rust with no Python, no I/O and no clock:
//! the caller passes "now" in, so the core is tested with `cargo test` alone.

pub mod ledger;
pub mod spouts;
pub mod table;
pub mod validate;
pub mod wire;

#[cfg(feature = "python")]
mod binding;
