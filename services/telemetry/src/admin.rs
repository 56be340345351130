//! The bearer-token check of the services' admin endpoints, in one place so
//! the API and the worker guard theirs the same way, and the field a rejected
//! body was wrong about.

/// Whether an `Authorization` header value presents `expected` as a bearer
/// token. No token configured means no access. The comparison reads every byte
/// whatever the first difference, so its time tells nothing about the token.
pub fn bearer_matches(authorization: Option<&str>, expected: Option<&str>) -> bool {
    let (Some(presented), Some(expected)) = (authorization.and_then(|v| v.strip_prefix("Bearer ")), expected) else {
        return false;
    };
    !expected.is_empty()
        && presented.len() == expected.len()
        && presented.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The field a serde message about a JSON body names, for the 422's `field`:
/// `missing field `hold_ms``, `unknown field `kill`, expected …`. `None` for
/// the others (bad syntax; a wrong type, which serde_json words without the
/// field).
pub fn field_named_in(serde_message: &str) -> Option<&str> {
    ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| serde_message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next())
}

#[cfg(test)]
mod tests {
    use super::{bearer_matches, field_named_in};

    #[test]
    fn the_field_of_a_missing_or_unknown_key_is_named() {
        assert_eq!(field_named_in("missing field `hold_ms` at line 1 column 14"), Some("hold_ms"));
        assert_eq!(field_named_in("unknown field `kill`, expected `wait_ms` or `hold_ms` at line 1"), Some("kill"));
        assert_eq!(field_named_in("invalid type: string \"x\", expected u64 at line 1 column 20"), None);
        assert_eq!(field_named_in("expected value at line 1 column 1"), None);
    }

    #[test]
    fn only_the_exact_token_passes() {
        assert!(bearer_matches(Some("Bearer s3cret"), Some("s3cret")));
        assert!(!bearer_matches(Some("Bearer s3cres"), Some("s3cret")));
        assert!(!bearer_matches(Some("Bearer s3cret2"), Some("s3cret")));
        assert!(!bearer_matches(Some("s3cret"), Some("s3cret")));
        assert!(!bearer_matches(None, Some("s3cret")));
        assert!(!bearer_matches(Some("Bearer "), Some("")));
        assert!(!bearer_matches(Some("Bearer x"), None));
    }
}
