//! Reports of reads and writes as Python dicts.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use zarrs_gpu::{RetrieveReport, WritePath, WriteReport};

/// A read's report as a dict.
pub(crate) fn report_dict<'py>(py: Python<'py>, r: &RetrieveReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("decode", r.decode.to_string())?;
    dict.set_item("io", r.io.as_ref().map(ToString::to_string))?;
    dict.set_item("chunks", r.chunks)?;
    dict.set_item("missing_chunks", r.missing_chunks)?;
    dict.set_item("host_decoded_chunks", r.host_decoded_chunks)?;
    dict.set_item("schedule", r.schedule.as_deref())?;
    dict.set_item("bytes_read", r.bytes_read)?;
    dict.set_item("peak_device_bytes", r.peak_device_bytes)?;
    dict.set_item("coalesced_reads", r.coalesced_reads)?;
    dict.set_item("device_decoder", r.device_decoder.as_deref())?;
    dict.set_item("host_reason", r.host_reason.clone())?;
    let stages = PyDict::new(py);
    for s in &r.stages {
        stages.set_item(s.stage, s.time.as_secs_f64())?;
    }
    dict.set_item("stages", stages)?;
    Ok(dict)
}

/// A write's report as a dict (the keys of `WriteReport`).
pub(crate) fn write_report_dict<'py>(py: Python<'py>, r: &WriteReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("path", if r.path == WritePath::Device { "device" } else { "host" })?;
    dict.set_item("reason", r.reason.clone())?;
    dict.set_item("chunks", r.chunks)?;
    dict.set_item("written", r.written)?;
    dict.set_item("erased", r.erased)?;
    dict.set_item("modified", r.modified)?;
    dict.set_item("bytes_encoded", r.bytes_encoded)?;
    dict.set_item("bytes_stored", r.bytes_stored)?;
    dict.set_item("seconds", r.seconds)?;
    dict.set_item("encode_seconds", r.encode_seconds)?;
    dict.set_item("read_seconds", r.read_seconds)?;
    dict.set_item("store_seconds", r.store_seconds)?;
    Ok(dict)
}
