use super::health::*;
use super::*;
use bytes::Bytes;

fn addrs(n: usize) -> Vec<Address> {
    (0..n)
        .map(|i| Address::Tcp(format!("10.0.{}.{}:50051", i / 250, i % 250 + 1)))
        .collect()
}

#[test]
fn subsets_are_deterministic_and_stable() {
    let all = addrs(1000);
    let a = subset(all.clone(), Some(10), 42);
    assert_eq!(a.len(), 10);
    assert_eq!(a, subset(all.clone(), Some(10), 42));
    let mut reversed = all.clone();
    reversed.reverse();
    assert_eq!(
        a,
        subset(reversed, Some(10), 42),
        "order of the set does not matter"
    );
    // Another seed, another subset.
    assert_ne!(a, subset(all.clone(), Some(10), 43));
    // Removing an endpoint outside the subset changes nothing; removing one inside
    // replaces only that one.
    let outside: Vec<_> = all.iter().filter(|x| !a.contains(x)).cloned().collect();
    let mut fewer = all.clone();
    fewer.retain(|x| *x != outside[0]);
    assert_eq!(a, subset(fewer, Some(10), 42));
    let mut fewer = all.clone();
    fewer.retain(|x| *x != a[0]);
    let b = subset(fewer, Some(10), 42);
    assert_eq!(b.iter().filter(|x| a.contains(x)).count(), 9);
    // Many seeds spread over the whole set.
    let mut hits = HashMap::new();
    for seed in 0..1000 {
        for x in subset(all.clone(), Some(10), seed) {
            *hits.entry(x).or_insert(0) += 1;
        }
    }
    assert!(hits.len() > 900, "{} endpoints used", hits.len());
}

#[test]
fn health_messages() {
    use crate::codec::Codec;
    let request = |service: &str| {
        HealthCodec
            .encode(HealthCheckRequest {
                service: service.into(),
            })
            .expect("encodes")
    };
    assert!(request("").is_empty());
    assert_eq!(&request("kv")[..], &[0x0a, 2, b'k', b'v']);
    let status = |b: &'static [u8]| {
        HealthCodec
            .decode(Bytes::from_static(b))
            .expect("never an error")
            .map(|r| r.status)
    };
    assert_eq!(status(&[0x08, 1]), Some(1));
    assert_eq!(status(&[]), Some(0));
    assert_eq!(status(&[0x12, 1, b'x', 0x08, 2]), Some(2));
    assert_eq!(status(&[0x08]), None);
    assert_eq!(status(&[0x12, 9, 1]), None);
}
