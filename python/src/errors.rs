//! Client errors as the Python exceptions of `granary.errors`, with the client's one text
//! ([`ClientError::message`]: each cause said once, and the server's text when the dispatcher
//! refused a call), the same text the `granary` command prints.

use granary_client::ClientError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The module that defines the exception classes (in Python, so that they can also derive from
/// the matching built-in exceptions: `ConnectionError`, `LookupError`, `ValueError`).
const ERRORS_MODULE: &str = "granary.errors";

/// The `granary.errors` class an error is raised as.
fn class_name(error: &ClientError) -> &'static str {
    match error {
        ClientError::NoDispatcher | ClientError::InvalidOptions(_) | ClientError::InvalidAddress { .. } => {
            "ConfigurationError"
        }
        ClientError::Unreachable { .. } => "DispatcherUnavailable",
        ClientError::Refused { .. } if error.is_not_found() => "PipelineNotFound",
        ClientError::Refused { .. } => "RequestRefused",
        ClientError::BadPosition(_) => "InvalidPosition",
        ClientError::BadPlan { .. } | ClientError::Assembly { .. } | ClientError::StreamsClosed => {
            "DataError"
        }
        ClientError::PipelineFailed { .. } => "PipelineFailed",
        ClientError::Runtime(_) => "GranaryError",
    }
}

/// The Python exception for `error`: an instance of its `granary.errors` class, with the error's
/// message, and the gRPC status code name as `code` when the dispatcher refused a call.
pub fn to_py(py: Python<'_>, error: ClientError) -> PyErr {
    let message = error.message();
    let code = match &error {
        ClientError::Refused { code, .. } => Some(format!("{code:?}")),
        _ => None,
    };
    match raise_as(py, class_name(&error), &message, code) {
        Ok(error) => error,
        Err(import_error) => {
            let fallback = PyRuntimeError::new_err(message);
            fallback.set_cause(py, Some(import_error));
            fallback
        }
    }
}

fn raise_as(py: Python<'_>, class: &str, message: &str, code: Option<String>) -> PyResult<PyErr> {
    let class = py.import(ERRORS_MODULE)?.getattr(class)?;
    let instance = class.call1((message,))?;
    if let Some(code) = code {
        instance.setattr("code", code)?;
    }
    Ok(PyErr::from_value(instance))
}
