//! `meridian kv txn`: the steps of a small transaction given on the command line.
//!
//! Each step is one argument (or one line of `--file`): `get KEY`, `get KEY for update`
//! (`Txn::get_for_update`: the commit checks the key under either isolation), `put KEY VALUE`
//! or `del KEY`. Words are separated by whitespace, so keys and values cannot contain it (use
//! `--hex` for arbitrary bytes). Steps run in order inside one transaction; gets see the
//! transaction's own earlier puts and deletes.

/// One step of a `kv txn`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Get(String),
    GetForUpdate(String),
    Put(String, String),
    Del(String),
}

/// Most steps one `kv txn` runs.
pub const MAX_STEPS: usize = 1_000;

/// Parses the steps; blank lines and lines starting with `#` are skipped.
pub fn parse_steps<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (n, line) in lines.into_iter().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let step = match words.as_slice() {
            ["get", key] => Step::Get(key.to_string()),
            ["get", key, "for", "update"] => Step::GetForUpdate(key.to_string()),
            ["put", key, value] => Step::Put(key.to_string(), value.to_string()),
            ["del", key] => Step::Del(key.to_string()),
            _ => {
                return Err(format!(
                    "step {}: {line:?}: want `get KEY`, `get KEY for update`, `put KEY VALUE` or `del KEY`",
                    n + 1
                ))
            }
        };
        steps.push(step);
        if steps.len() > MAX_STEPS {
            return Err(format!("more than {MAX_STEPS} steps"));
        }
    }
    if steps.is_empty() {
        return Err("no steps: give `get KEY`, `get KEY for update`, `put KEY VALUE` or `del KEY` arguments".into());
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_and_bad_ones_are_named() {
        let steps = parse_steps([
            "get a",
            "  put b 1 ",
            "# comment",
            "",
            "del c",
            "get d for update",
        ])
        .unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Get("a".into()),
                Step::Put("b".into(), "1".into()),
                Step::Del("c".into()),
                Step::GetForUpdate("d".into()),
            ]
        );
        let e = parse_steps(["get a", "put b"]).unwrap_err();
        assert!(e.contains("step 2") && e.contains("put KEY VALUE"), "{e}");
        assert!(parse_steps(["fetch a"]).is_err());
        assert!(parse_steps(["get a for"]).is_err());
        assert!(parse_steps(["get a for share"]).is_err());
        assert!(parse_steps(["", "#"]).unwrap_err().contains("no steps"));
        let many: Vec<String> = (0..=MAX_STEPS).map(|i| format!("get k{i}")).collect();
        assert!(parse_steps(many.iter().map(String::as_str)).is_err());
    }
}
