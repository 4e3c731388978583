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

/// The class of `err`, as [`classify`] names it.
pub(crate) fn failure_of(err: &RedisError) -> RedisFailure {
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => return RedisFailure::NoScript,
        ErrorKind::Server(ServerErrorKind::ReadOnly) => return RedisFailure::ReadOnly,
        ErrorKind::Server(ServerErrorKind::BusyLoading) => return RedisFailure::Loading,
        // Cluster faults the client could not resolve within its few retries:
        // the slot's master is failing over, or the map moved again meanwhile.
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => return RedisFailure::ClusterUnavailable,
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
        Some("WRONGTYPE") => return RedisFailure::WrongType,
        Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "MOVED" | "ASK") => {
            return RedisFailure::ClusterUnavailable;
        }
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
    use redis::Value;
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
            ("WRONGTYPE", RedisFailure::WrongType),
            ("CLUSTERDOWN", RedisFailure::ClusterUnavailable),
            ("TRYAGAIN", RedisFailure::ClusterUnavailable),
            ("MASTERDOWN", RedisFailure::ClusterUnavailable),
            ("MOVED", RedisFailure::ClusterUnavailable),
            ("ASK", RedisFailure::ClusterUnavailable),
        ];
        for (code, expected) in cases {
            let err = redis::make_extension_error(code.to_string(), Some("detail".into()));
            assert_eq!(classify(err).redis_failure(), Some(expected), "{code}");
        }
    }

    /// The replies a Cluster node sends while it fails over, parsed as redis-rs
    /// parses them off the wire (so with their typed kinds): each is a
    /// transient fault that did not run the command. A `READONLY` from a
    /// demoted master and a `LOADING` replica stay their own kinds.
    #[test]
    fn cluster_replies_are_transient_and_did_not_run() {
        let cases = [
            (
                "-CLUSTERDOWN The cluster is down",
                RedisFailure::ClusterUnavailable,
            ),
            (
                "-CLUSTERDOWN Hash slot not served",
                RedisFailure::ClusterUnavailable,
            ),
            (
                "-TRYAGAIN Multiple keys request during rehashing of slot",
                RedisFailure::ClusterUnavailable,
            ),
            (
                "-MASTERDOWN Link with MASTER is down",
                RedisFailure::ClusterUnavailable,
            ),
            (
                "-MOVED 3999 127.0.0.1:6381",
                RedisFailure::ClusterUnavailable,
            ),
            ("-ASK 3999 127.0.0.1:6381", RedisFailure::ClusterUnavailable),
            (
                "-READONLY You can't write against a read only replica.",
                RedisFailure::ReadOnly,
            ),
            (
                "-LOADING Redis is loading the dataset in memory",
                RedisFailure::Loading,
            ),
        ];
        for (wire, expected) in cases {
            let value = redis::parse_redis_value(format!("{wire}\r\n").as_bytes())
                .expect("an error reply parses");
            let Value::ServerError(e) = value else {
                panic!("{wire} parsed as {value:?}");
            };
            let err = classify_server(e);
            assert_eq!(err.redis_failure(), Some(expected), "{wire}");
            assert!(err.is_transient(), "{wire}");
            assert!(!expected.may_have_run(), "{wire}");
        }
        // Inside a script, a cluster error comes back as the script's error
        // whose code is still the command's.
        let in_script = redis::make_extension_error(
            "CLUSTERDOWN".to_string(),
            Some("Error running script: The cluster is down".into()),
        );
        assert_eq!(
            classify(in_script).redis_failure(),
            Some(RedisFailure::ClusterUnavailable)
        );
    }
}
