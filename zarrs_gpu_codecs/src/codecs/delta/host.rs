//! numcodecs' `Delta` arithmetic on the host, numpy's to the bit.
//!
//! numcodecs encodes `enc[0] = arr[0]; enc[1:] = np.diff(arr)` (the differences computed in
//! `dtype`, wrapping for integers, then cast to `astype`) and decodes `np.cumsum(enc, out=dec)`.
//! That sum runs in numpy's promotion of the two types (`np.result_type(astype, dtype)`: `dtype`'s
//! wrapping arithmetic where both are integers, else a float, even for `u8` with a signed type),
//! one element after another, each partial sum cast to `dtype`. Casts are numpy's: integers
//! wrap, integers to floats round to nearest, floats to integers truncate (out of range through
//! `i64` as on x86-64, where numpy leaves it undefined), `float16` sums round after every step.
//! `enc[0] = arr[0]` is a scalar assignment: for a signed integer `astype` numpy refuses a first
//! element out of its range (so does [`encode`]); for the others it casts.

use std::fmt;

use half::f16;

/// An element type numcodecs' `Delta` takes here: numpy's integers and floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaType {
    /// numpy's `int8`.
    I8,
    /// numpy's `int16`.
    I16,
    /// numpy's `int32`.
    I32,
    /// numpy's `int64`.
    I64,
    /// numpy's `uint8`.
    U8,
    /// numpy's `uint16`.
    U16,
    /// numpy's `uint32`.
    U32,
    /// numpy's `uint64`.
    U64,
    /// numpy's `float16`.
    F16,
    /// numpy's `float32`.
    F32,
    /// numpy's `float64`.
    F64,
}

impl DeltaType {
    /// Every type, integers first.
    pub const ALL: [Self; 11] = [
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::U8,
        Self::U16,
        Self::U32,
        Self::U64,
        Self::F16,
        Self::F32,
        Self::F64,
    ];

    /// Bytes per element.
    #[must_use]
    pub const fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 | Self::F16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// `float16`, `float32`, `float64`.
    #[must_use]
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::F32 | Self::F64)
    }

    /// `int8` to `int64`.
    #[must_use]
    pub const fn is_signed_int(self) -> bool {
        matches!(self, Self::I8 | Self::I16 | Self::I32 | Self::I64)
    }

    /// numpy's name of the type (`int32`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    /// A numpy type string as numcodecs writes it (`<i4`, `|u1`, `i4`, `int32`; any byte order
    /// mark), and the byte order it names (`<`, `>`; None: none, `|` or `=`).
    #[must_use]
    pub fn parse(s: &str) -> Option<(Self, Option<char>)> {
        let (order, rest) = match s.chars().next() {
            Some(c @ ('<' | '>')) => (Some(c), &s[1..]),
            Some('|' | '=') => (None, &s[1..]),
            _ => (None, s),
        };
        let ty = Self::ALL.into_iter().find(|t| {
            let code = format!(
                "{}{}",
                if t.is_float() {
                    'f'
                } else if t.is_signed_int() {
                    'i'
                } else {
                    'u'
                },
                t.size()
            );
            rest == code || (rest == t.name() && order.is_none() && rest.len() == s.len())
        })?;
        Some((ty, order))
    }

    /// The type numpy sums `astype` elements in when decoding into `dtype`:
    /// `np.result_type(astype, dtype)`.
    #[must_use]
    pub(crate) fn sum_type(dtype: Self, astype: Self) -> SumType {
        let float = |size: usize| match size {
            2 => SumType::F16,
            4 => SumType::F32,
            _ => SumType::F64,
        };
        match (dtype.is_float(), astype.is_float()) {
            (false, false) => {
                // Only u64 with a signed integer has no integer type holding both.
                let mixed_64 =
                    (dtype == Self::U64 && astype.is_signed_int()) || (astype == Self::U64 && dtype.is_signed_int());
                if mixed_64 {
                    SumType::F64
                } else {
                    SumType::Wrapping
                }
            }
            (true, true) => float(dtype.size().max(astype.size())),
            (true, false) | (false, true) => {
                let (f, i) = if dtype.is_float() { (dtype, astype) } else { (astype, dtype) };
                // The smallest float holding every value of the integer: 1 byte f16, 2 bytes f32.
                let holds = match i.size() {
                    1 => 2,
                    2 => 4,
                    _ => 8,
                };
                float(f.size().max(holds))
            }
        }
    }
}

impl fmt::Display for DeltaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type a decode sums in ([`DeltaType::sum_type`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SumType {
    /// `dtype`'s wrapping integer arithmetic (a wider integer type wraps to the same values).
    Wrapping,
    /// `float16`, each addition rounded to half.
    F16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

/// One value on its way between types.
#[derive(Clone, Copy, Debug)]
enum Scalar {
    Int(i128),
    F16(f16),
    F32(f32),
    F64(f64),
}

/// numpy's float-to-integer cast on x86-64: truncation, through `i64` (or `u64` above `i64`),
/// then wrapping to the narrower type; NaN is 0 (numpy: undefined).
#[allow(clippy::cast_possible_truncation)]
fn float_to_int(x: f64) -> i128 {
    if x >= 9_223_372_036_854_775_808.0 {
        i128::from(x as u64)
    } else {
        i128::from(x as i64)
    }
}

/// An element type's numpy casts and arithmetic.
trait Elem: Copy + bytemuck::Pod {
    fn scalar(self) -> Scalar;
    fn cast(s: Scalar) -> Self;
    /// `a - b` in this type (integers wrap; `float16` through `float32`, as numpy).
    fn sub(self, other: Self) -> Self;
    /// `a + b` in this type.
    fn add(self, other: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline]
            fn scalar(self) -> Scalar {
                Scalar::Int(i128::from(self))
            }
            #[inline]
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            fn cast(s: Scalar) -> Self {
                match s {
                    Scalar::Int(v) => v as Self,
                    Scalar::F16(x) => float_to_int(x.to_f64()) as Self,
                    Scalar::F32(x) => float_to_int(f64::from(x)) as Self,
                    Scalar::F64(x) => float_to_int(x) as Self,
                }
            }
            #[inline]
            fn sub(self, other: Self) -> Self {
                self.wrapping_sub(other)
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

/// The float types: their scalar, and each scalar cast as numpy casts it (`from_int`, `from_f16`,
/// `from_f32`, `from_f64`); arithmetic in the type (`float16` through `float32`, as `half` does).
macro_rules! float_elem {
    ($t:ty, $variant:ident, $from_int:expr, $from_f16:expr, $from_f32:expr, $from_f64:expr) => {
        impl Elem for $t {
            #[inline]
            fn scalar(self) -> Scalar {
                Scalar::$variant(self)
            }
            #[inline]
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::redundant_closure_call)]
            fn cast(s: Scalar) -> Self {
                match s {
                    Scalar::Int(v) => $from_int(v),
                    Scalar::F16(x) => $from_f16(x),
                    Scalar::F32(x) => $from_f32(x),
                    Scalar::F64(x) => $from_f64(x),
                }
            }
            #[inline]
            fn sub(self, other: Self) -> Self {
                self - other
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                self + other
            }
        }
    };
}
float_elem!(f16, F16, |v: i128| f16::from_f64(v as f64), |x| x, f16::from_f32, f16::from_f64);
float_elem!(f32, F32, |v: i128| v as f32, |x: f16| x.to_f32(), |x| x, |x: f64| x as f32);
float_elem!(f64, F64, |v: i128| v as f64, |x: f16| x.to_f64(), f64::from, |x| x);

/// Elements of `bytes` (native byte order, any alignment).
fn load<T: Elem>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes.chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned)
}

fn store<T: Elem>(out: &mut [u8], values: impl Iterator<Item = T>) {
    for (slot, v) in out.chunks_exact_mut(size_of::<T>()).zip(values) {
        slot.copy_from_slice(bytemuck::bytes_of(&v));
    }
}

/// The cumulative sum of `enc` (`A` elements) in `L`, each partial sum cast to `D`.
fn cumsum<A: Elem, L: Elem, D: Elem>(enc: &[u8], out: &mut [u8]) {
    let mut sum: Option<L> = None;
    store::<D>(
        out,
        load::<A>(enc).map(|a| {
            let a = L::cast(a.scalar());
            let s = sum.map_or(a, |s| s.add(a));
            sum = Some(s);
            D::cast(s.scalar())
        }),
    );
}

fn decode_as<A: Elem, D: Elem>(sum: SumType, enc: &[u8], out: &mut [u8]) {
    match sum {
        SumType::Wrapping => cumsum::<A, D, D>(enc, out),
        SumType::F16 => cumsum::<A, f16, D>(enc, out),
        SumType::F32 => cumsum::<A, f32, D>(enc, out),
        SumType::F64 => cumsum::<A, f64, D>(enc, out),
    }
}

fn encode_as<D: Elem, A: Elem>(astype: DeltaType, arr: &[u8], out: &mut [u8]) -> Result<(), String> {
    let mut values = load::<D>(arr);
    let Some(first) = values.next() else { return Ok(()) };
    if astype.is_signed_int() {
        // numpy assigns the first element as a Python int: out of the range of a signed
        // astype it raises (OverflowError; NaN and infinities a ValueError).
        let exact = match first.scalar() {
            Scalar::Int(v) => Some(v),
            Scalar::F16(x) => Some(x.to_f64()).filter(|x| x.is_finite()).map(float_to_int),
            Scalar::F32(x) => Some(f64::from(x)).filter(|x| x.is_finite()).map(float_to_int),
            Scalar::F64(x) => Some(x).filter(|x| x.is_finite()).map(float_to_int),
        };
        let bits = 8 * astype.size() as u32;
        let (min, max) = (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
        if !exact.is_some_and(|v| (min..=max).contains(&v)) {
            return Err(format!("the chunk's first element {:?} does not fit astype {astype}", first.scalar()));
        }
    }
    let mut prev = first;
    let diffs = std::iter::once(A::cast(first.scalar())).chain(values.map(|v| {
        let d = v.sub(prev);
        prev = v;
        A::cast(d.scalar())
    }));
    store::<A>(out, diffs);
    Ok(())
}

/// Dispatch `$f::<$a, $b>` over two runtime types.
macro_rules! dispatch2 {
    ($f:ident, $first:expr, $second:expr, ($($args:expr),*)) => {{
        macro_rules! inner {
            ($x:ty) => {
                match $second {
                    DeltaType::I8 => $f::<$x, i8>($($args),*),
                    DeltaType::I16 => $f::<$x, i16>($($args),*),
                    DeltaType::I32 => $f::<$x, i32>($($args),*),
                    DeltaType::I64 => $f::<$x, i64>($($args),*),
                    DeltaType::U8 => $f::<$x, u8>($($args),*),
                    DeltaType::U16 => $f::<$x, u16>($($args),*),
                    DeltaType::U32 => $f::<$x, u32>($($args),*),
                    DeltaType::U64 => $f::<$x, u64>($($args),*),
                    DeltaType::F16 => $f::<$x, f16>($($args),*),
                    DeltaType::F32 => $f::<$x, f32>($($args),*),
                    DeltaType::F64 => $f::<$x, f64>($($args),*),
                }
            };
        }
        match $first {
            DeltaType::I8 => inner!(i8),
            DeltaType::I16 => inner!(i16),
            DeltaType::I32 => inner!(i32),
            DeltaType::I64 => inner!(i64),
            DeltaType::U8 => inner!(u8),
            DeltaType::U16 => inner!(u16),
            DeltaType::U32 => inner!(u32),
            DeltaType::U64 => inner!(u64),
            DeltaType::F16 => inner!(f16),
            DeltaType::F32 => inner!(f32),
            DeltaType::F64 => inner!(f64),
        }
    }};
}

/// Decode `enc` (`astype` elements, native byte order) into `out` (`dtype` elements, as many).
///
/// # Panics
/// When the lengths are not the same number of elements (the caller checks them).
pub(crate) fn decode(dtype: DeltaType, astype: DeltaType, enc: &[u8], out: &mut [u8]) {
    assert_eq!(enc.len() / astype.size(), out.len() / dtype.size(), "delta: element counts differ");
    let sum = DeltaType::sum_type(dtype, astype);
    dispatch2!(decode_as, astype, dtype, (sum, enc, out));
}

/// Encode `arr` (`dtype` elements, native byte order) into `out` (`astype` elements, as many).
///
/// # Errors
/// When the first element does not fit a signed integer `astype` (numpy refuses it too).
///
/// # Panics
/// When the lengths are not the same number of elements (the caller checks them).
pub(crate) fn encode(dtype: DeltaType, astype: DeltaType, arr: &[u8], out: &mut [u8]) -> Result<(), String> {
    assert_eq!(arr.len() / dtype.size(), out.len() / astype.size(), "delta: element counts differ");
    dispatch2!(encode_as, dtype, astype, (astype, arr, out))
}

/// Cast `values` (`from` elements) to `to` elements, as numpy's `astype` (the fill value's
/// encoding).
pub(crate) fn cast(from: DeltaType, to: DeltaType, values: &[u8]) -> Vec<u8> {
    fn cast_as<F: Elem, T: Elem>(values: &[u8], out: &mut [u8]) {
        store::<T>(out, load::<F>(values).map(|v| T::cast(v.scalar())));
    }
    let mut out = vec![0u8; values.len() / from.size() * to.size()];
    dispatch2!(cast_as, from, to, (values, &mut out));
    out
}
