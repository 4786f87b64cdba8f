//! numpy-style keys as array subsets.

use std::ops::Range;

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyEllipsis, PySlice, PyTuple};
use zarrs_gpu::subset::IndexItem;

/// A numpy-style index (an integer, a slice, `...`, or a tuple of them) as the subset it selects
/// and the shape of the result (integers drop their dimension), by the rule the command line's
/// `--subset` follows (`zarrs_gpu::subset::select`): numpy's. Slices clamp, empty ones select nothing;
/// steps other than 1 are refused.
pub(crate) fn index_to_subset(key: &Bound<'_, PyAny>, shape: &[u64]) -> PyResult<(Vec<Range<u64>>, Vec<u64>)> {
    let items: Vec<Bound<'_, PyAny>> = match key.downcast::<PyTuple>() {
        Ok(tuple) => tuple.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    let items = items.iter().map(index_item).collect::<PyResult<Vec<_>>>()?;
    let selection = zarrs_gpu::subset::select(&items, shape).map_err(PyIndexError::new_err)?;
    Ok((selection.ranges, selection.shape))
}

/// What `Array.read`'s `subset` selects: None the whole array, a string the command line's form
/// (`zarrs_gpu::parse_subset`: integers keep their dimension), anything else an index.
pub(crate) fn key_to_subset(key: Option<&Bound<'_, PyAny>>, shape: &[u64]) -> PyResult<(Vec<Range<u64>>, Vec<u64>)> {
    match key {
        None => Ok((shape.iter().map(|&n| 0..n).collect(), shape.to_vec())),
        Some(spec) if spec.is_instance_of::<pyo3::types::PyString>() => {
            let subset = zarrs_gpu::parse_subset(&spec.extract::<String>()?, shape).map_err(PyIndexError::new_err)?;
            Ok((subset.to_ranges(), subset.shape().to_vec()))
        }
        Some(key) => index_to_subset(key, shape),
    }
}

/// One item of an index as the shared rule's.
pub(crate) fn index_item(item: &Bound<'_, PyAny>) -> PyResult<IndexItem> {
    if item.is(PyEllipsis::get(item.py())) {
        return Ok(IndexItem::Ellipsis);
    }
    if let Ok(slice) = item.downcast::<PySlice>() {
        let bound = |name: &str| slice_bound(&slice.getattr(name)?);
        return Ok(IndexItem::Slice { start: bound("start")?, stop: bound("stop")?, step: bound("step")? });
    }
    if item.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyIndexError::new_err("booleans are not indices (numpy reads them as a mask or a new axis)"));
    }
    // Integers, numpy's among them (anything with `__index__`).
    if let Ok(index) = item.call_method0("__index__") {
        return Ok(IndexItem::Index(saturated(&index)?));
    }
    Err(PyIndexError::new_err(format!(
        "only integers, slices (`:`) and ellipsis (`...`) are valid indices, not {}",
        item.get_type().name()?
    )))
}

/// A slice's start, stop or step: None, or an integer (saturated to 128 bits: a bound that far
/// out clamps all the same).
pub(crate) fn slice_bound(value: &Bound<'_, PyAny>) -> PyResult<Option<i128>> {
    if value.is_none() {
        return Ok(None);
    }
    let index = value
        .call_method0("__index__")
        .map_err(|_| PyTypeError::new_err("slice indices must be integers or None or have an __index__ method"))?;
    saturated(&index).map(Some)
}

/// A Python int as an i128, saturated.
pub(crate) fn saturated(int: &Bound<'_, PyAny>) -> PyResult<i128> {
    match int.extract::<i128>() {
        Ok(v) => Ok(v),
        Err(_) if int.lt(0)? => Ok(i128::MIN),
        Err(_) => Ok(i128::MAX),
    }
}
