//! The bearer-token check of the services' admin endpoints, in one place so
//! the API and the worker guard theirs the same way.

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

#[cfg(test)]
mod tests {
    use super::bearer_matches;

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
