//! Delta debugging (Zeller and Hildebrandt's ddmin): from a list of items
//! that fails a test, a 1-minimal sublist that still fails, where removing
//! any one item makes it pass.
//!
//! The test is a run, or several, so it is async, costly and may give up:
//! a candidate answers `Some(true)` (still fails), `Some(false)` (passes) or
//! `None` (the budget is spent; the search ends with the smallest failing
//! list found so far). The same candidate is never tried twice.

use std::collections::HashMap;
use std::future::Future;

/// What the search ended with: the smallest failing list it found (the
/// positions, ascending, into the list it was given), whether it is known
/// to be 1-minimal, and how many candidates it tried and heard back from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minimized {
    pub kept: Vec<usize>,
    pub minimal: bool,
    pub tries: usize,
}

/// Searches the `len` items, which fail together, for a 1-minimal failing
/// subset; `fails` answers for a candidate given as ascending positions.
pub async fn ddmin<F, Fut>(len: usize, mut fails: F) -> Minimized
where
    F: FnMut(Vec<usize>) -> Fut,
    Fut: Future<Output = Option<bool>>,
{
    let mut kept: Vec<usize> = (0..len).collect();
    let mut seen: HashMap<Vec<usize>, bool> = HashMap::new();
    let mut tries = 0;
    let mut n = 2usize;
    // Each round tries the chunks, then their complements.
    'search: while kept.len() >= 2 {
        let chunks = split(&kept, n);
        let mut candidates: Vec<(Vec<usize>, bool)> = chunks.iter().map(|c| (c.clone(), true)).collect();
        // With two chunks each complement is the other chunk.
        if n > 2 {
            candidates.extend(chunks.iter().map(|c| (complement(&kept, c), false)));
        }
        for (candidate, is_chunk) in candidates {
            let verdict = match seen.get(&candidate) {
                Some(v) => *v,
                None => {
                    let Some(v) = fails(candidate.clone()).await else {
                        return Minimized { kept, minimal: false, tries };
                    };
                    tries += 1;
                    seen.insert(candidate.clone(), v);
                    v
                }
            };
            if verdict {
                n = if is_chunk { 2 } else { (n - 1).max(2) };
                kept = candidate;
                continue 'search;
            }
        }
        if n >= kept.len() {
            break;
        }
        n = (n * 2).min(kept.len());
    }
    Minimized { kept, minimal: true, tries }
}

/// `items` in `n` chunks as even as can be, in order.
fn split(items: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.clamp(1, items.len().max(1));
    let (size, extra) = (items.len() / n, items.len() % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let len = size + usize::from(i < extra);
        out.push(items[at..at + len].to_vec());
        at += len;
    }
    out
}

fn complement(items: &[usize], chunk: &[usize]) -> Vec<usize> {
    items.iter().copied().filter(|i| !chunk.contains(i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    /// 1-minimal: the list fails, and so would no list with one item fewer.
    fn one_minimal(kept: &[usize], fails: &dyn Fn(&[usize]) -> bool) -> bool {
        fails(kept) && (0..kept.len()).all(|i| !fails(&[&kept[..i], &kept[i + 1..]].concat()))
    }

    #[test]
    fn two_items_that_fail_only_together_are_what_is_left() {
        let fails = |c: &[usize]| c.contains(&3) && c.contains(&7);
        let got = block_on(ddmin(10, |c| async move { Some(fails(&c)) }));
        assert_eq!(got.kept, vec![3, 7]);
        assert!(got.minimal && one_minimal(&got.kept, &fails), "{got:?}");
        assert!(got.tries < 40, "{got:?}");
    }

    #[test]
    fn of_two_causes_one_is_kept_and_that_is_minimal() {
        let fails = |c: &[usize]| c.contains(&5) || (c.contains(&1) && c.contains(&2));
        for len in [6, 7, 13] {
            let got = block_on(ddmin(len, |c| async move { Some(fails(&c)) }));
            assert!(one_minimal(&got.kept, &fails), "{len}: {got:?}");
        }
    }

    #[test]
    fn a_single_item_and_an_empty_list_need_no_tries() {
        assert_eq!(block_on(ddmin(1, |_| async { Some(true) })), Minimized { kept: vec![0], minimal: true, tries: 0 });
        assert_eq!(block_on(ddmin(0, |_| async { Some(true) })), Minimized { kept: vec![], minimal: true, tries: 0 });
    }

    /// A spent budget ends the search with the smallest failing list so far,
    /// which still fails, and says it may not be minimal.
    #[test]
    fn a_spent_budget_keeps_the_best_so_far() {
        let fails = |c: &[usize]| c.contains(&3) && c.contains(&7);
        let mut left = 3;
        let got = block_on(ddmin(16, |c| {
            left -= 1;
            let answer = (left >= 0).then(|| fails(&c));
            async move { answer }
        }));
        assert!(!got.minimal, "{got:?}");
        assert!(fails(&got.kept), "{got:?}");
        assert!(got.kept.len() < 16, "something was cut within the budget: {got:?}");
        assert_eq!(got.tries, 3);
    }
}
