//! User keys: validation and escaping.

use crate::error::{Error, Result};

/// The longest user key, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// Checks a user key: not empty, at most [`MAX_KEY_LEN`] bytes, no control
/// characters.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{validate_key, Error};
///
/// assert!(validate_key("user:42").is_ok());
/// assert!(matches!(validate_key(""), Err(Error::EmptyKey)));
/// assert!(matches!(validate_key("a\nb"), Err(Error::KeyControlChar { position: 1 })));
/// ```
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    // ASCII keys (most) are checked a byte at a time; the control characters
    // of ASCII are the bytes below 0x20 and 0x7F.
    let control = if key.is_ascii() {
        key.bytes().position(|b| b < 0x20 || b == 0x7f)
    } else {
        key.char_indices()
            .find(|(_, c)| c.is_control())
            .map(|(i, _)| i)
    };
    match control {
        Some(position) => Err(Error::KeyControlChar { position }),
        None => Ok(()),
    }
}

/// Escapes a validated user key for use inside a Redis Cluster hash tag: `%`,
/// `{` and `}` become `%25`, `%7B` and `%7D`, so a user's braces can neither end
/// our hash tag early nor choose the slot.
///
/// # Examples
///
/// ```
/// use tierlimit_core::escape_key;
///
/// assert_eq!(escape_key("a{b}%"), "a%7Bb%7D%25");
/// assert_eq!(escape_key("plain"), "plain");
/// ```
pub fn escape_key(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.bytes().any(|b| matches!(b, b'%' | b'{' | b'}')) {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_injective_on_braces_and_percent() {
        assert_ne!(escape_key("%7B"), escape_key("{"));
        assert!(!escape_key("}{").contains(['{', '}']));
    }

    #[test]
    fn control_characters_are_found_in_ascii_and_other_keys() {
        for (key, position) in [("ab\x7f", 2), ("a\tb", 1), ("é\u{85}", 2), ("\u{1}é", 0)] {
            assert!(
                matches!(validate_key(key), Err(Error::KeyControlChar { position: p }) if p == position),
                "{key:?}"
            );
        }
        assert!(validate_key("é-ok~").is_ok());
    }

    #[test]
    fn long_keys_are_refused() {
        let key = "k".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(validate_key(&key), Err(Error::KeyTooLong { .. })));
        assert!(validate_key(&key[1..]).is_ok());
    }
}
