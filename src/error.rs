//! Typed errors at every boundary; the Node layer maps [`Error::code`] to a stable JS `code`.
use std::path::PathBuf;

/// Every error mlex returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No model at the path / repo id given.
    #[error("model not found: {0}")]
    ModelNotFound(String),
    /// A checkpoint file is malformed: names the file and the tensor or field.
    #[error("invalid checkpoint {}: {msg}", file.display())]
    InvalidCheckpoint { file: PathBuf, msg: String },
    /// A caller passed something invalid (options, messages, token ids).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An MLX operation failed; carries MLX's own message.
    #[error("MLX error: {0}")]
    Mlx(String),
    /// MLX could not allocate.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The tokenizer or chat template failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The caller aborted the request.
    #[error("aborted")]
    Aborted,
    /// The session was closed (or its engine thread has gone).
    #[error("session closed")]
    SessionClosed,
    #[error("{context}: {source}")]
    Io { context: String, #[source] source: std::io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The same error again (for each of several requests one failure ends; `io::Error` does not
    /// clone, so an I/O error's source is carried by its kind and message).
    pub fn duplicate(&self) -> Error {
        match self {
            Error::ModelNotFound(s) => Error::ModelNotFound(s.clone()),
            Error::InvalidCheckpoint { file, msg } => Error::InvalidCheckpoint { file: file.clone(), msg: msg.clone() },
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Mlx(s) => Error::Mlx(s.clone()),
            Error::OutOfMemory(s) => Error::OutOfMemory(s.clone()),
            Error::Tokenizer(s) => Error::Tokenizer(s.clone()),
            Error::Aborted => Error::Aborted,
            Error::SessionClosed => Error::SessionClosed,
            Error::Io { context, source } => {
                Error::Io { context: context.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
        }
    }

    /// The stable machine-readable code (used by the Node package as `err.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::ModelNotFound(_) => "MODEL_NOT_FOUND",
            Error::InvalidCheckpoint { .. } => "INVALID_CHECKPOINT",
            Error::InvalidArgument(_) => "INVALID_ARGUMENT",
            Error::Mlx(_) => "MLX_ERROR",
            Error::OutOfMemory(_) => "OUT_OF_MEMORY",
            Error::Tokenizer(_) => "INVALID_CHECKPOINT",
            Error::Aborted => "ABORTED",
            Error::SessionClosed => "SESSION_CLOSED",
            Error::Io { .. } => "MODEL_NOT_FOUND",
        }
    }

    pub fn checkpoint(file: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::InvalidCheckpoint { file: file.into(), msg: msg.into() }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}
