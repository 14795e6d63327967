//! Workload properties: YCSB's `-P file` / `-p key=value` configuration.
//!
//! Workload files use the Java `.properties` format. This parser covers what workload files
//! contain in practice:
//!
//! - lines whose first non-blank character is `#` or `!` are comments; blank lines are skipped;
//! - the key ends at the first unescaped `=`, `:` or whitespace; blanks around the separator are
//!   dropped; a key with no separator has the empty value;
//! - a line ending in an odd number of backslashes continues on the next line (leading blanks of
//!   the continuation are dropped);
//! - escapes `\t \n \r \f \\ \= \: \#`, `\ ` and `\uXXXX`; any other escaped character stands
//!   for itself, as in Java.
//!
//! Later settings override earlier ones, so command-line `-p` values applied after the files
//! win, as in YCSB. Limits: a file larger than [`MAX_PROPERTIES_FILE_BYTES`] is refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

/// Largest workload file accepted (workload files are a few hundred bytes).
pub const MAX_PROPERTIES_FILE_BYTES: u64 = 1024 * 1024;

/// Errors reading or interpreting properties.
#[derive(Debug, thiserror::Error)]
pub enum PropertiesError {
    #[error("cannot read properties file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("properties file {path} is {size_bytes} bytes, over the limit of {MAX_PROPERTIES_FILE_BYTES}")]
    TooLarge { path: String, size_bytes: u64 },
    #[error("bad \\u escape in line {line}")]
    BadUnicodeEscape { line: usize },
    #[error("property {key}={value} is not a valid {expected}")]
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("override {0:?} is not of the form key=value")]
    BadOverride(String),
}

/// An ordered map of property names to string values with typed getters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    values: BTreeMap<String, String>,
}

impl Properties {
    /// An empty set of properties.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses properties text; later keys override earlier ones.
    pub fn parse(text: &str) -> Result<Self, PropertiesError> {
        let mut properties = Self::new();
        properties.merge_text(text)?;
        Ok(properties)
    }

    /// Reads and merges a properties file into `self`.
    pub fn merge_file(&mut self, path: &Path) -> Result<(), PropertiesError> {
        let display = path.display().to_string();
        let metadata = std::fs::metadata(path).map_err(|error| PropertiesError::Io {
            path: display.clone(),
            error,
        })?;
        if metadata.len() > MAX_PROPERTIES_FILE_BYTES {
            return Err(PropertiesError::TooLarge {
                path: display,
                size_bytes: metadata.len(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|error| PropertiesError::Io {
            path: display,
            error,
        })?;
        self.merge_text(&text)
    }

    /// Applies one `key=value` override (the `-p` flag).
    pub fn merge_override(&mut self, assignment: &str) -> Result<(), PropertiesError> {
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| PropertiesError::BadOverride(assignment.to_string()))?;
        if key.trim().is_empty() {
            return Err(PropertiesError::BadOverride(assignment.to_string()));
        }
        self.set(key.trim(), value);
        Ok(())
    }

    /// Parses properties text into `self`.
    pub fn merge_text(&mut self, text: &str) -> Result<(), PropertiesError> {
        for (line_number, logical) in logical_lines(text) {
            let (key, value) = split_key_value(&logical, line_number)?;
            self.values.insert(key, value);
        }
        Ok(())
    }

    /// Sets a property.
    pub fn set(&mut self, key: &str, value: &str) {
        self.values.insert(key.to_string(), value.to_string());
    }

    /// The raw value of a property.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value or a default.
    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// Parses a property with `FromStr`, or returns `default` when it is absent.
    pub fn parse_or<T: FromStr>(
        &self,
        key: &str,
        default: T,
        expected: &'static str,
    ) -> Result<T, PropertiesError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value.trim().parse().map_err(|_| PropertiesError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                expected,
            }),
        }
    }

    /// Parses a Java-style boolean (`true`, case-insensitive; anything else is false, as
    /// `Boolean.parseBoolean` does).
    pub fn bool_or(&self, key: &str, default: bool) -> bool {
        match self.get(key) {
            None => default,
            Some(value) => value.trim().eq_ignore_ascii_case("true"),
        }
    }

    /// All properties in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }
}

/// Joins continuation lines and drops comments and blank lines; yields (first line number, text).
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let trimmed = raw.trim_start();
        let continuing = current.is_some();
        if !continuing
            && (trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!'))
        {
            continue;
        }
        let trailing_backslashes = trimmed.chars().rev().take_while(|c| *c == '\\').count();
        let continues = trailing_backslashes % 2 == 1;
        let content = if continues {
            &trimmed[..trimmed.len() - 1]
        } else {
            trimmed
        };
        let entry = current.get_or_insert_with(|| (line_number, String::new()));
        entry.1.push_str(content);
        if !continues {
            if let Some(done) = current.take() {
                lines.push(done);
            }
        }
    }
    if let Some(done) = current.take() {
        lines.push(done);
    }
    lines
}

fn split_key_value(line: &str, line_number: usize) -> Result<(String, String), PropertiesError> {
    let chars: Vec<char> = line.chars().collect();
    let mut index = 0;
    let mut key_end = chars.len();
    while index < chars.len() {
        match chars[index] {
            '\\' => index += 2,
            '=' | ':' => {
                key_end = index;
                break;
            }
            c if c.is_whitespace() => {
                key_end = index;
                break;
            }
            _ => index += 1,
        }
    }
    let key_end = key_end.min(chars.len());
    let key: String = chars[..key_end].iter().collect();
    // Skip blanks, at most one separator, then blanks again.
    let mut value_start = key_end;
    while value_start < chars.len() && chars[value_start].is_whitespace() {
        value_start += 1;
    }
    if value_start < chars.len() && (chars[value_start] == '=' || chars[value_start] == ':') {
        value_start += 1;
    }
    while value_start < chars.len() && chars[value_start].is_whitespace() {
        value_start += 1;
    }
    let value: String = chars[value_start..].iter().collect();
    Ok((unescape(&key, line_number)?, unescape(&value, line_number)?))
}

fn unescape(text: &str, line_number: usize) -> Result<String, PropertiesError> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 4)
                    .and_then(char::from_u32)
                    .ok_or(PropertiesError::BadUnicodeEscape { line: line_number })?;
                out.push(code);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Comments, separators, blanks, continuations and escapes parse as Java does.
    #[test]
    fn parses_java_properties() {
        let text = "# a comment\n\
                    ! another\n\
                    \n\
                    recordcount=1000\n\
                    \x20\x20operationcount = 2000\n\
                    workload:site.ycsb.workloads.CoreWorkload\n\
                    spaced value here\n\
                    long=first,\\\n\
                    \x20\x20\x20\x20second\n\
                    escaped\\=key=a\\tb\\u0041\n\
                    empty\n";
        let properties = Properties::parse(text).expect("valid");
        assert_eq!(properties.get("recordcount"), Some("1000"));
        assert_eq!(properties.get("operationcount"), Some("2000"));
        assert_eq!(
            properties.get("workload"),
            Some("site.ycsb.workloads.CoreWorkload")
        );
        assert_eq!(properties.get("spaced"), Some("value here"));
        assert_eq!(properties.get("long"), Some("first,second"));
        assert_eq!(properties.get("escaped=key"), Some("a\tbA"));
        assert_eq!(properties.get("empty"), Some(""));
        assert_eq!(properties.get("# a comment"), None);
    }

    /// Later values and `-p` overrides win; typed getters report bad values.
    #[test]
    fn overrides_and_typed_getters() {
        let mut properties = Properties::parse("recordcount=10\nreadallfields=TRUE\n").expect("ok");
        properties.merge_override("recordcount=20").expect("ok");
        assert_eq!(
            properties.parse_or("recordcount", 0u64, "integer").unwrap(),
            20
        );
        assert!(properties.bool_or("readallfields", false));
        assert!(!properties.bool_or("missing", false));
        properties.merge_override("fieldcount=ten").expect("ok");
        assert!(properties.parse_or("fieldcount", 10u64, "integer").is_err());
        assert!(properties.merge_override("novalue").is_err());
    }
}
