//! Redis errors, classified for the circuit breaker.

use redis::{ErrorKind, RedisError, ServerError, ServerErrorKind};
use tierlimit_core::{Error, RedisFailure};

/// Classifies a redis-rs error, keeping it as the source.
pub(crate) fn classify(err: RedisError) -> Error {
    let kind = failure_of(&err);
    Error::redis(kind, Some(Box::new(err)))
}

/// Classifies an error reply of one command in a pipeline.
pub(crate) fn classify_server(err: ServerError) -> Error {
    classify(RedisError::from(err))
}

/// The deadline passed.
pub(crate) fn timeout() -> Error {
    Error::redis(RedisFailure::Timeout, None)
}

fn failure_of(err: &RedisError) -> RedisFailure {
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => return RedisFailure::NoScript,
        ErrorKind::Server(ServerErrorKind::ReadOnly) => return RedisFailure::ReadOnly,
        ErrorKind::Server(ServerErrorKind::BusyLoading) => return RedisFailure::Loading,
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => return RedisFailure::MalformedReply,
        _ => {}
    }
    // Inside a script, a failed write comes back as a script error whose code is
    // still the command's: "-OOM command not allowed when used memory > ...".
    match err.code() {
        Some("OOM") => return RedisFailure::OutOfMemory,
        Some("READONLY") => return RedisFailure::ReadOnly,
        Some("LOADING") => return RedisFailure::Loading,
        Some("NOSCRIPT") => return RedisFailure::NoScript,
        _ => {}
    }
    if err.is_connection_refusal() {
        RedisFailure::ConnectionRefused
    } else if err.is_timeout() {
        RedisFailure::Timeout
    } else if err.is_io_error() || err.is_connection_dropped() {
        RedisFailure::ConnectionLost
    } else {
        RedisFailure::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn io_err(kind: io::ErrorKind) -> RedisError {
        RedisError::from(io::Error::from(kind))
    }

    #[test]
    fn io_errors_by_kind() {
        let cases = [
            (
                io::ErrorKind::ConnectionRefused,
                RedisFailure::ConnectionRefused,
            ),
            (io::ErrorKind::TimedOut, RedisFailure::Timeout),
            (io::ErrorKind::ConnectionReset, RedisFailure::ConnectionLost),
            (io::ErrorKind::BrokenPipe, RedisFailure::ConnectionLost),
            (io::ErrorKind::UnexpectedEof, RedisFailure::ConnectionLost),
        ];
        for (io_kind, expected) in cases {
            let err = classify(io_err(io_kind));
            assert_eq!(err.redis_failure(), Some(expected), "{io_kind:?}");
            assert!(std::error::Error::source(&err).is_some(), "source kept");
        }
    }

    #[test]
    fn server_errors_by_code() {
        let cases = [
            ("NOSCRIPT", RedisFailure::NoScript),
            ("READONLY", RedisFailure::ReadOnly),
            ("LOADING", RedisFailure::Loading),
            ("OOM", RedisFailure::OutOfMemory),
            ("WRONGTYPE", RedisFailure::Other),
        ];
        for (code, expected) in cases {
            let err = redis::make_extension_error(code.to_string(), Some("detail".into()));
            assert_eq!(classify(err).redis_failure(), Some(expected), "{code}");
        }
    }
}
