//! Random boxes inside an array, for the tests that compare reads of many subsets with zarrs'.
//! Shared by the test binaries that include it with `#[path]`.

use rand::rngs::StdRng;
use rand::Rng;
use zarrs::array::ArraySubset;

/// A box inside `shape`: in each dimension a random start and a random end after it.
pub(crate) fn random_box(shape: &[u64], rng: &mut StdRng) -> ArraySubset {
    let ranges: Vec<_> = shape
        .iter()
        .map(|&s| {
            let a = rng.random_range(0..s);
            a..rng.random_range(a + 1..=s)
        })
        .collect();
    ArraySubset::new_with_ranges(&ranges)
}
