//! Which of a codec family's two device decoders a read uses: ours (any input an error status at
//! worst) or nvCOMP's, or the family's own pick. One type for the families that have both (zstd,
//! LZ4), named by their environment variables.

use crate::env::EnvVar;

/// The device decoder of a codec family that has ours and nvCOMP's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecoderChoice {
    /// The family's pick: zstd's by the read's trust (ours where nothing verifies the frames
    /// first, nvCOMP's where crc32c does or the trust is `trusted`); LZ4's always ours.
    #[default]
    Auto,
    /// Ours: a batch in a few launches, any input an error status at worst.
    Ours,
    /// nvCOMP's batched decoder (its input must be valid: the host check makes sure of what it
    /// can).
    Nvcomp,
}

impl std::str::FromStr for DecoderChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "ours" => Ok(Self::Ours),
            "nvcomp" => Ok(Self::Nvcomp),
            other => Err(format!("{other:?}: the decoder is auto, ours or nvcomp")),
        }
    }
}

impl DecoderChoice {
    /// The decoder `var` names (unset or empty: the default), or why its value is not one.
    pub(crate) fn from_env(var: &EnvVar) -> Result<Self, String> {
        Ok(var.parse(|v| v.parse().ok()).map_err(|e| e.to_string())?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders_are_named_and_another_name_is_an_error_saying_the_names() {
        assert_eq!("ours".parse::<DecoderChoice>(), Ok(DecoderChoice::Ours));
        assert_eq!(" NVCOMP ".parse::<DecoderChoice>(), Ok(DecoderChoice::Nvcomp));
        assert_eq!(" Auto".parse::<DecoderChoice>(), Ok(DecoderChoice::Auto));
        let err = "fast".parse::<DecoderChoice>().unwrap_err();
        assert!(err.contains("auto, ours or nvcomp"), "{err}");
        assert_eq!(DecoderChoice::default(), DecoderChoice::Auto);
    }
}
