//! Reading a request body field by field, so that every error names the field at fault
//! (serde's derive would report a line and column instead). Unknown fields are ignored.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request body: a JSON object.
#[derive(Debug, Clone)]
pub struct Body(Map<String, Value>);

impl Body {
    /// The body a handler received (a read failure, e.g. over the size limit, keeps its
    /// status), parsed as a JSON object.
    pub fn read(
        bytes: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    ) -> Result<Body, ApiError> {
        let bytes = bytes.map_err(|r| ApiError::body(r.status(), r.body_text()))?;
        Body::parse(&bytes)
    }

    /// Parses `bytes` as a JSON object. serde_json refuses nesting deeper than 128 levels,
    /// so a hostile body cannot exhaust the stack.
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid(
                "The request body is empty; expected a JSON object.",
            ));
        }
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(Body(map)),
            Ok(_) => Err(ApiError::invalid("The request body must be a JSON object.")),
            Err(e) => Err(ApiError::invalid(format!(
                "The request body is not valid JSON: {e}"
            ))),
        }
    }

    /// The raw value of `key` (`None` when absent or null).
    pub fn raw(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// `key` as a `T` (`None` when absent or null); a value of the wrong type is a 400 that
    /// names the field and the type expected.
    pub fn get<T: DeserializeOwned>(
        &self,
        key: &str,
        expected: &str,
    ) -> Result<Option<T>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|_| ApiError::param(key, format!("'{key}' must be {expected}."))),
        }
    }

    /// `key` as a finite number in `[lo, hi]`.
    pub fn number(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let v = self.get::<f64>(key, "a number")?;
        match v {
            Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::param(
                key,
                format!("'{key}' must be between {lo} and {hi}, got {x}."),
            )),
            v => Ok(v),
        }
    }

    /// `key` as an integer in `[lo, hi]`.
    pub fn integer(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let v = self.get::<i64>(key, "an integer")?;
        match v {
            Some(x) if x < lo || x > hi => Err(ApiError::param(
                key,
                format!("'{key}' must be an integer between {lo} and {hi}, got {x}."),
            )),
            v => Ok(v),
        }
    }

    /// `key` as a boolean (default `false`).
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        Ok(self.get::<bool>(key, "a boolean")?.unwrap_or(false))
    }

    /// `key` as a string.
    pub fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        self.get::<String>(key, "a string")
    }
}
