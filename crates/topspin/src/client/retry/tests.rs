use super::*;

#[test]
fn most_specific_rule_wins() {
    let r = Retries::with_rule(None, "", Policy::Retry(RetryPolicy::default()));
    let r = Retries::with_rule(Some(r), "/a.S/", Policy::Hedge(HedgingPolicy::default()));
    let r = Retries::with_rule(Some(r), "/a.S/Put", Policy::Never);
    assert_eq!(r.policy("/a.S/Put"), Some(&Policy::Never));
    assert!(matches!(r.policy("/a.S/Get"), Some(Policy::Hedge(_))));
    assert!(matches!(r.policy("/b.T/Get"), Some(Policy::Retry(_))));
    let none = Retries::with_rule(None, "/a.S/Get", Policy::Never);
    assert_eq!(none.policy("/a.S/Other"), None);
}

#[test]
fn budget_allows_ratio_plus_reserve() {
    let r = Retries::with_budget(None, RetryBudget::new(0.5, 1, Duration::from_secs(10)));
    // Reserve: 1/s × 10 s = 10 retries before any call.
    assert_eq!((0..100).filter(|_| r.withdraw()).count(), 10);
    for _ in 0..20 {
        r.deposit();
    }
    // 20 calls × 0.5 = 10 more.
    assert_eq!((0..100).filter(|_| r.withdraw()).count(), 10);
}

#[test]
fn pause_is_jittered_below_the_ceiling() {
    let p = RetryPolicy::default().with_backoff(
        Duration::from_millis(100),
        Duration::from_millis(300),
        2.0,
    );
    for n in 1..8 {
        let ceiling = Duration::from_millis((100u64 << (n - 1)).min(300));
        assert!(p.pause(n) <= ceiling);
    }
}

#[test]
fn unsent_mark_is_internal() {
    let s = unsent(Status::unavailable("x"));
    assert!(is_unsent(&s));
    assert!(s.metadata().is_empty());
    assert!(!is_unsent(&began(Status::not_found("y"))));
    assert!(is_unsent(&began(Status::unavailable("y"))));
}
