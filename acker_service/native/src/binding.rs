//! The thin PyO3 binding: `acker_service._native.NativeCore` and two helper functions.
//!
//! It converts between Python and the pure core and nothing else: arrays in as slices,
//! outcome columns out as numpy arrays that take over the Rust vectors (no copy), and
//! refusals as the exception classes of `acker_service.batch`. The GIL is released while
//! a batch is decoded, validated and applied.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::ledger::{BatchOutput, Ledger, LedgerError, Moved, Outcomes, TreeInfo};
use crate::validate::{validate, BatchError, Limits, Refusal};
use crate::wire::decode_apply_request;

/// Outcome columns as Python sees them: (spout names, spout index per outcome, roots,
/// outcome codes, latency in microseconds). Spout indices point into the names list.
type Columns<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyArray1<u16>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<u64>>,
);

/// (applied, deduplicated, ignored, ended trees, timeout-reset notifications).
type Applied<'py> = (u64, u64, u64, Columns<'py>, Columns<'py>);

fn refusal_error(py: Python<'_>, err: BatchError) -> PyErr {
    let class = match err.refusal {
        Refusal::Invalid => "InvalidBatch",
        Refusal::TooLarge => "BatchTooLarge",
        Refusal::WrongShard => "WrongShard",
    };
    match py.import("acker_service.batch").and_then(|m| m.getattr(class)) {
        Ok(cls) => PyErr::from_type(cls.cast_into().expect("an exception class"), err.message),
        Err(e) => e,
    }
}

fn ledger_error(py: Python<'_>, err: LedgerError) -> PyErr {
    match err {
        LedgerError::Config(m) => PyValueError::new_err(m),
        LedgerError::TooManySpouts(message) => refusal_error(
            py,
            BatchError {
                refusal: Refusal::TooLarge,
                message,
            },
        ),
    }
}

/// Turn outcome columns into numpy arrays, with spout ids renumbered into a names list.
fn columns<'py>(py: Python<'py>, ledger: &Ledger, out: Outcomes) -> PyResult<Columns<'py>> {
    let mut ids: Vec<u16> = Vec::new();
    let mut local: Vec<u16> = Vec::with_capacity(out.spout.len());
    let mut last = (0u16, 0u16);
    for &id in &out.spout {
        // Batches are mostly of one spout: remember the last lookup.
        let idx = if id == last.0 && !ids.is_empty() {
            last.1
        } else {
            let idx = match ids.iter().position(|&x| x == id) {
                Some(p) => p as u16,
                None => {
                    ids.push(id);
                    (ids.len() - 1) as u16
                }
            };
            last = (id, idx);
            idx
        };
        local.push(idx);
    }
    let names = PyList::new(py, ids.iter().map(|&id| ledger.spout_name(id)))?;
    Ok((
        names,
        local.into_pyarray(py),
        out.root.into_pyarray(py),
        out.outcome.into_pyarray(py),
        out.latency_us.into_pyarray(py),
    ))
}

/// The native ledger behind `acker_service.native_ledger.NativeLedger`.
#[pyclass(module = "acker_service._native")]
pub struct NativeCore {
    ledger: Ledger,
}

impl NativeCore {
    fn finish<'py>(&self, py: Python<'py>, out: BatchOutput) -> PyResult<Applied<'py>> {
        Ok((
            out.applied,
            out.deduplicated,
            out.ignored,
            columns(py, &self.ledger, out.ended)?,
            columns(py, &self.ledger, out.resets)?,
        ))
    }
}

#[pymethods]
impl NativeCore {
    /// A ledger with timeout `message_timeout` s and `buckets` buckets, created at clock time `now`.
    #[new]
    fn new(py: Python<'_>, message_timeout: f64, buckets: u64, now: f64, seed: u64) -> PyResult<Self> {
        let ledger = Ledger::new(message_timeout, buckets, now, seed).map_err(|e| ledger_error(py, e))?;
        Ok(NativeCore { ledger })
    }

    /// Decode serialized `ApplyRequest` bytes, validate and apply them at `now`, GIL released.
    ///
    /// Raises InvalidBatch / BatchTooLarge / WrongShard (nothing applied) on refusal.
    /// At most `expire_limit` due trees are collected first (all when None): the rest
    /// wait for `expire_some`, except those the batch touches, which expire first.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (data, now, shard_index, shard_count, max_batch, expire_limit=None, replicas=1))]
    fn apply_request<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        now: f64,
        shard_index: u64,
        shard_count: u64,
        max_batch: usize,
        expire_limit: Option<usize>,
        replicas: u64,
    ) -> PyResult<Applied<'py>> {
        let expire_limit = expire_limit.unwrap_or(usize::MAX);
        let limits = Limits {
            shard_index,
            shard_count,
            max_batch,
            replicas,
        };
        let ledger = &mut self.ledger;
        let result = py.detach(|| -> Result<BatchOutput, Result<BatchError, LedgerError>> {
            let req = decode_apply_request(data).map_err(|message| {
                Ok(BatchError {
                    refusal: Refusal::Invalid,
                    message,
                })
            })?;
            let ops = req.ops();
            validate(&ops, limits).map_err(Ok)?;
            let mut out = BatchOutput::default();
            ledger
                .apply_expiring_at_most(&ops, now, expire_limit, &mut out)
                .map_err(Err)?;
            Ok(out)
        });
        match result {
            Ok(out) => self.finish(py, out),
            Err(Ok(refusal)) => Err(refusal_error(py, refusal)),
            Err(Err(e)) => Err(ledger_error(py, e)),
        }
    }

    /// Rotate as due at `now`, then collect at most `limit` expired trees (all when None), GIL
    /// released; returns (TIMED_OUT columns, whether more are due).
    #[pyo3(signature = (now, limit=None))]
    fn advance<'py>(&mut self, py: Python<'py>, now: f64, limit: Option<usize>) -> PyResult<(Columns<'py>, bool)> {
        let ledger = &mut self.ledger;
        let mut out = Outcomes::default();
        let more = py.detach(|| ledger.advance_at_most(now, limit.unwrap_or(usize::MAX), &mut out));
        Ok((columns(py, &self.ledger, out)?, more))
    }

    /// Seconds until the next rotation is due at clock time `now` (never negative).
    fn seconds_until_rotation(&self, now: f64) -> f64 {
        self.ledger.seconds_until_rotation(now)
    }

    /// The counters by name (the fields of `acker_service.ledger.LedgerStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ledger.stats();
        let d = PyDict::new(py);
        for (name, value) in [
            ("inits", s.inits),
            ("acks", s.acks),
            ("fails", s.fails),
            ("resets", s.resets),
            ("acked", s.acked),
            ("failed", s.failed),
            ("timed_out", s.timed_out),
            ("orphaned", s.orphaned),
            ("duplicate_inits", s.duplicate_inits),
            ("deduplicated", s.deduplicated),
            ("outlived", s.outlived),
            ("force_failed", s.force_failed),
            ("moved_out", s.moved_out),
            ("moved_in", s.moved_in),
        ] {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// Root ids of all entries (tests and diagnostics).
    fn roots<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        self.ledger.roots().into_pyarray(py)
    }

    /// Trees whose init was applied and that have no outcome yet.
    #[getter]
    fn pending_trees(&self) -> u64 {
        self.ledger.pending_trees()
    }

    /// Entries whose init has not (yet) arrived.
    #[getter]
    fn orphan_entries(&self) -> u64 {
        self.ledger.orphan_entries()
    }

    /// Number of buckets.
    #[getter]
    fn buckets(&self) -> u64 {
        self.ledger.buckets()
    }

    /// Seconds between rotations.
    #[getter]
    fn rotation_period(&self) -> f64 {
        self.ledger.rotation_period()
    }

    /// The message timeout in seconds.
    #[getter]
    fn message_timeout(&self) -> f64 {
        self.ledger.message_timeout()
    }

    /// Slots of the entry table (24 bytes each).
    #[getter]
    fn capacity(&self) -> usize {
        self.ledger.capacity()
    }

    // -- operating a running ledger: inspect, force-fail (the core is in ledger/admin.rs) --

    /// Set the timeout mode (`progress`: every applied ack restarts the timeout) and the
    /// lifetime cap in seconds (0: none).
    fn set_timeout_rules(&mut self, py: Python<'_>, progress: bool, max_lifetime: f64) -> PyResult<()> {
        self.ledger
            .set_timeout_rules(progress, max_lifetime)
            .map_err(|e| ledger_error(py, e))
    }

    /// The state of each root at `now`: (root, status, spout name or None, age µs, failed, resets, dedup keys).
    fn inspect(&self, roots: PyReadonlyArray1<'_, u64>, now: f64) -> PyResult<Vec<TreeRow>> {
        let infos = self.ledger.inspect(roots.as_slice()?, now);
        Ok(infos.iter().map(|i| self.row(i)).collect())
    }

    /// The `k` oldest pending trees, oldest first, as rows like `inspect`'s.
    fn oldest(&self, py: Python<'_>, k: usize, now: f64) -> Vec<TreeRow> {
        let ledger = &self.ledger;
        let infos = py.detach(|| ledger.oldest(k, now));
        infos.iter().map(|i| self.row(i)).collect()
    }

    /// Pending trees by age: (count per bucket of `bounds_us`, then above all; sum of ages in µs).
    fn age_histogram(&self, py: Python<'_>, bounds_us: Vec<u64>, now: f64) -> (Vec<u64>, u128) {
        let ledger = &self.ledger;
        py.detach(|| ledger.age_histogram(&bounds_us, now))
    }

    /// Fail the pending trees among `roots` now; their outcome columns.
    fn force_fail<'py>(&mut self, py: Python<'py>, roots: PyReadonlyArray1<'py, u64>, now: f64) -> PyResult<Columns<'py>> {
        let mut out = Outcomes::default();
        self.ledger.force_fail(roots.as_slice()?, now, &mut out);
        columns(py, &self.ledger, out)
    }

    /// Fail every pending tree of `spout` now; their outcome columns.
    fn force_fail_spout<'py>(&mut self, py: Python<'py>, spout: &str, now: f64) -> PyResult<Columns<'py>> {
        let ledger = &mut self.ledger;
        let mut out = Outcomes::default();
        py.detach(|| ledger.force_fail_spout(spout, now, &mut out));
        columns(py, &self.ledger, out)
    }

    /// Remove and return the live entries whose root is not `keep`'s under `count` shards
    /// (`keep` -1: all), GIL released.
    fn export_moving<'py>(
        &mut self,
        py: Python<'py>,
        count: u64,
        keep: i64,
        now: f64,
    ) -> MovedColumns<'py> {
        let ledger = &mut self.ledger;
        let m = py.detach(|| ledger.export_moving(count, keep, now));
        moved_columns(py, m)
    }

    /// The roots and ages (microseconds) of the live entries `export_moving` would take
    /// out, every entry left in place, GIL released.
    fn moving_roots<'py>(
        &mut self,
        py: Python<'py>,
        count: u64,
        keep: i64,
        now: f64,
    ) -> (Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>) {
        let ledger = &mut self.ledger;
        let (roots, ages) = py.detach(|| ledger.moving_roots(count, keep, now));
        (roots.into_pyarray(py), ages.into_pyarray(py))
    }

    /// Remove and return the live entries among `roots` (one slice of a cut), GIL released;
    /// `last`: the cut's last slice (the table may give back memory then).
    fn export_roots<'py>(
        &mut self,
        py: Python<'py>,
        roots: PyReadonlyArray1<'py, u64>,
        now: f64,
        last: bool,
    ) -> PyResult<MovedColumns<'py>> {
        let roots = roots.as_slice()?.to_vec();
        let ledger = &mut self.ledger;
        let m = py.detach(|| ledger.export_roots(&roots, now, last));
        Ok(moved_columns(py, m))
    }

    /// Copy (not remove) the live entries whose root is `index`'s under `count` shards, GIL released.
    fn export_snapshot<'py>(
        &mut self,
        py: Python<'py>,
        count: u64,
        index: u64,
        now: f64,
    ) -> MovedColumns<'py> {
        let ledger = &mut self.ledger;
        let m = py.detach(|| ledger.export_snapshot(count, index, now));
        moved_columns(py, m)
    }

    /// Merge moved entries in (columns as `export_moving` returns them; the caller checked
    /// their lengths); the outcome columns of the trees the merge ended.
    #[allow(clippy::too_many_arguments)]
    fn import_entries<'py>(
        &mut self,
        py: Python<'py>,
        roots: PyReadonlyArray1<'py, u64>,
        values: PyReadonlyArray1<'py, u64>,
        spouts: Vec<String>,
        spout_index: PyReadonlyArray1<'py, i32>,
        ages_us: PyReadonlyArray1<'py, u64>,
        generations: PyReadonlyArray1<'py, u8>,
        failed: PyReadonlyArray1<'py, bool>,
        resets: PyReadonlyArray1<'py, u32>,
        key_counts: PyReadonlyArray1<'py, u32>,
        keys: PyReadonlyArray1<'py, u64>,
        now: f64,
    ) -> PyResult<Columns<'py>> {
        let moved = Moved {
            roots: roots.as_slice()?.to_vec(),
            values: values.as_slice()?.to_vec(),
            spouts,
            spout_index: spout_index.as_slice()?.to_vec(),
            ages_us: ages_us.as_slice()?.to_vec(),
            generations: generations.as_slice()?.to_vec(),
            failed: failed.as_slice()?.to_vec(),
            resets: resets.as_slice()?.to_vec(),
            key_counts: key_counts.as_slice()?.to_vec(),
            keys: keys.as_slice()?.to_vec(),
        };
        let n = moved.roots.len();
        let lengths = [
            moved.values.len(),
            moved.spout_index.len(),
            moved.ages_us.len(),
            moved.generations.len(),
            moved.failed.len(),
            moved.resets.len(),
            moved.key_counts.len(),
        ];
        let total_keys: u64 = moved.key_counts.iter().map(|&c| c as u64).sum();
        let bad_index = moved
            .spout_index
            .iter()
            .any(|&i| i < -1 || i >= moved.spouts.len() as i32);
        if lengths.iter().any(|&l| l != n) || total_keys != moved.keys.len() as u64 || bad_index {
            return Err(PyValueError::new_err(
                "moved entries: the columns disagree in length, key counts or spout indices",
            ));
        }
        let mut out = Outcomes::default();
        let ledger = &mut self.ledger;
        py.detach(|| ledger.import_entries(&moved, now, &mut out))
            .map_err(|e| ledger_error(py, e))?;
        columns(py, &self.ledger, out)
    }
}

/// Moved entries as Python sees them: (roots, values, spout names, spout index (-1: no
/// init yet), ages µs, generations, failed, resets, key counts, keys); see `acker_service.handoff`.
type MovedColumns<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    Vec<String>,
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
);

/// A ledger's moved entries handed to Python as columns (the arrays move without a copy).
fn moved_columns(py: Python<'_>, m: Moved) -> MovedColumns<'_> {
    (
        m.roots.into_pyarray(py),
        m.values.into_pyarray(py),
        m.spouts,
        m.spout_index.into_pyarray(py),
        m.ages_us.into_pyarray(py),
        m.generations.into_pyarray(py),
        m.failed.into_pyarray(py),
        m.resets.into_pyarray(py),
        m.key_counts.into_pyarray(py),
        m.keys.into_pyarray(py),
    )
}

/// One root's state as Python sees it (see `NativeCore::inspect`).
type TreeRow = (u64, u8, Option<String>, u64, bool, u32, u32);

impl NativeCore {
    fn row(&self, i: &TreeInfo) -> TreeRow {
        let spout = (i.spout != 0).then(|| self.ledger.spout_name(i.spout).to_owned());
        (i.root, i.status as u8, spout, i.age_us, i.failed, i.resets, i.dedup_keys)
    }
}

/// Decode `ApplyRequest` bytes into a dict of lists (tests compare it with the .proto).
#[pyfunction]
fn decode_apply_request_fields<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let req = decode_apply_request(data).map_err(|m| {
        refusal_error(
            py,
            BatchError {
                refusal: Refusal::Invalid,
                message: m,
            },
        )
    })?;
    let d = PyDict::new(py);
    d.set_item("kinds", req.kinds)?;
    d.set_item("root_ids", req.root_ids)?;
    d.set_item("values", req.values)?;
    d.set_item("dedup_keys", req.dedup_keys)?;
    d.set_item("spouts", req.spouts)?;
    d.set_item("spout_index", req.spout_index)?;
    Ok(d)
}

/// Decode and validate request bytes without applying them; raise what Apply would refuse with.
#[pyfunction]
#[pyo3(signature = (data, shard_index, shard_count, max_batch, replicas=1))]
fn validate_request(
    py: Python<'_>,
    data: &[u8],
    shard_index: u64,
    shard_count: u64,
    max_batch: usize,
    replicas: u64,
) -> PyResult<()> {
    let err = |e| refusal_error(py, e);
    let req = decode_apply_request(data).map_err(|message| {
        err(BatchError {
            refusal: Refusal::Invalid,
            message,
        })
    })?;
    let ops = req.ops();
    let limits = Limits {
        shard_index,
        shard_count,
        max_batch,
        replicas,
    };
    validate(&ops, limits).map_err(err)
}

/// The extension module `acker_service._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeCore>()?;
    m.add_function(wrap_pyfunction!(decode_apply_request_fields, m)?)?;
    m.add_function(wrap_pyfunction!(validate_request, m)?)?;
    m.add("MAX_BUCKETS", crate::ledger::MAX_BUCKETS)?;
    Ok(())
}
