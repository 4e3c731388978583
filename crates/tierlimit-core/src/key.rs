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
    let class = classify(key);
    if class & (CONTROL | NON_ASCII) == 0 {
        return Ok(());
    }
    control_position(key, class)
}

/// Where the first control character is, for a key `classify` found one in
/// or found non-ASCII (which may hide one).
fn control_position(key: &str, class: u8) -> Result<()> {
    let non_ascii = class & NON_ASCII != 0;
    let control = if !non_ascii {
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
    if classify(key) & SPECIAL == 0 {
        return std::borrow::Cow::Borrowed(key);
    }
    escaped(key)
}

/// [`validate_key`] and then [`escape_key`], in one pass over the key for
/// the common one (ASCII, nothing to escape): what a check does first.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Error, validate_and_escape_key};
///
/// assert_eq!(validate_and_escape_key("a{b}")?, "a%7Bb%7D");
/// assert!(matches!(validate_and_escape_key("a\tb"), Err(Error::KeyControlChar { position: 1 })));
/// # Ok::<(), Error>(())
/// ```
#[inline]
pub fn validate_and_escape_key(key: &str) -> Result<std::borrow::Cow<'_, str>> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        validate_key(key)?;
    }
    let class = classify(key);
    if class & (CONTROL | NON_ASCII) != 0 {
        control_position(key, class)?;
    }
    if class & SPECIAL == 0 {
        return Ok(std::borrow::Cow::Borrowed(key));
    }
    Ok(escaped(key))
}

/// A byte below 0x20 or 0x7F: an ASCII control character.
const CONTROL: u8 = 1;
/// `%`, `{` or `}`: escaped.
const SPECIAL: u8 = 2;
/// Part of a non-ASCII character (which may be a control character).
const NON_ASCII: u8 = 4;

/// Each byte's classes.
const CLASSES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = if b < 0x20 || b == 0x7f {
            CONTROL
        } else if b >= 0x80 {
            NON_ASCII
        } else if b == b'%' as usize || b == b'{' as usize || b == b'}' as usize {
            SPECIAL
        } else {
            0
        };
        b += 1;
    }
    t
};

/// Every class of byte `key` holds, in one pass without branches.
fn classify(key: &str) -> u8 {
    key.bytes().fold(0, |acc, b| acc | CLASSES[usize::from(b)])
}

/// `key` escaped into a new string (it has something to escape).
fn escaped(key: &str) -> std::borrow::Cow<'_, str> {
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
    fn one_pass_agrees_with_validate_then_escape() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let keys = [
            "user:42",
            "",
            long.as_str(),
            "a{b}%",
            "a\tb",
            "del\x7f",
            "caf\u{e9}",
            "x\u{85}y",
            "{\u{e9}}",
            "%",
        ];
        for key in keys {
            let separate = validate_key(key).map(|()| escape_key(key));
            assert_eq!(
                format!("{:?}", validate_and_escape_key(key)),
                format!("{separate:?}"),
                "{key:?}"
            );
        }
        for b in 0u8..0x80 {
            let key = format!("a{}", char::from(b));
            let separate = validate_key(&key).map(|()| escape_key(&key));
            assert_eq!(
                format!("{:?}", validate_and_escape_key(&key)),
                format!("{separate:?}"),
                "byte {b:#x}"
            );
            let control = b < 0x20 || b == 0x7f;
            assert_eq!(validate_key(&key).is_err(), control, "byte {b:#x}");
        }
    }

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
