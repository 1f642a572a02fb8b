//! Unit tests of `listing.rs`: the answer's text, its pieces' size, pages, and how much of
//! the source a piece reads.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use gpushare_proto::{ClaimInfo, ClaimPage, ClaimState, Response};

use super::*;

/// Claims by UID, counting how many were handed out.
#[derive(Default)]
struct Map {
    claims: RefCell<BTreeMap<String, Arc<Claim>>>,
    read: Cell<usize>,
}

impl ClaimSource for Map {
    fn claims_after(&self, after: Option<&str>, n: usize) -> Vec<Arc<Claim>> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let out: Vec<_> = self
            .claims
            .borrow()
            .range::<str, _>((from, Bound::Unbounded))
            .take(n)
            .map(|(_, c)| Arc::clone(c))
            .collect();
        self.read.set(self.read.get() + out.len());
        out
    }
}

/// A claim whose JSON is about `pad` bytes longer than a bare one.
fn claim(uid: &str, pad: usize) -> ClaimInfo {
    ClaimInfo {
        uid: uid.into(),
        namespace: "ns".into(),
        name: "x".repeat(pad),
        state: ClaimState::Prepared,
        groups: vec![],
        requests: vec![],
        cdi_spec: format!("/var/run/cdi/gpushare.io-claim_{uid}.json"),
        attach_limit: None,
        attached: vec![],
        last_error: None,
        restarts: 0,
        resource_version: None,
        generation: 1,
    }
}

fn map(n: usize, pad: usize) -> Map {
    let m = Map::default();
    for i in 0..n {
        let uid = format!("c-{i:05}");
        m.claims.borrow_mut().insert(
            uid.clone(),
            Arc::new(crate::claim::wire::claim_of(claim(&uid, pad))),
        );
    }
    m
}

impl Map {
    fn uids(&self) -> Vec<String> {
        self.claims.borrow().keys().cloned().collect()
    }
}

/// Every piece of the answer, and the answer line they make.
fn pieces<S: ClaimSource>(source: &S, listing: &Listing) -> (Vec<usize>, Response) {
    let mut p = Pieces::new(source, listing);
    let (mut sizes, mut line) = (vec![], vec![]);
    while let Some(piece) = p.next_piece().unwrap() {
        sizes.push(piece.len());
        line.extend_from_slice(piece);
    }
    assert_eq!(line.last(), Some(&b'\n'), "one line");
    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
    (sizes, serde_json::from_slice(&line).unwrap())
}

fn whole(version: u32, id: u64) -> Listing {
    Listing {
        version,
        id,
        page: None,
    }
}

fn page(limit: usize, after: Option<&str>) -> Listing {
    Listing {
        version: 2,
        id: 3,
        page: Some(Page {
            limit,
            after: after.map(str::to_string),
        }),
    }
}

#[test]
fn a_whole_listing_is_the_list_in_pieces_of_bounded_size() {
    // About 1.2 KiB a claim: 3,000 claims make an answer of about 3.5 MiB.
    let m = map(3000, 1000);
    let (sizes, response) = pieces(&m, &whole(1, 8));
    let expected: Vec<ClaimInfo> = m.claims.borrow().values().map(|c| claim_info(c)).collect();
    assert_eq!(response.version, 1);
    assert_eq!(response.id, 8);
    assert!(response.error.is_none());
    assert_eq!(
        response.result.unwrap(),
        serde_json::to_value(&expected).unwrap()
    );
    let biggest_claim = serde_json::to_vec(&expected[0]).unwrap().len() + 1;
    assert!(sizes.len() > 50, "{} pieces", sizes.len());
    for size in &sizes {
        assert!(
            *size <= PIECE_BYTES + biggest_claim,
            "a piece of {size} bytes"
        );
    }
}

#[test]
fn the_source_is_read_only_as_the_pieces_are_taken() {
    let m = map(3000, 1000);
    let listing = whole(1, 1);
    let mut p = Pieces::new(&m, &listing);
    let mut given = 0;
    for _ in 0..3 {
        given += p.next_piece().unwrap().unwrap().len();
        // What was read but not written is at most one batch.
        let written = given / 1000;
        assert!(
            m.read.get() <= written + 2 * BATCH,
            "{} claims read for {given} bytes",
            m.read.get()
        );
    }
    drop(p);
    assert!(m.read.get() < 300, "{} of 3000 claims read", m.read.get());
}

#[test]
fn no_claims_is_an_empty_list_and_an_empty_last_page() {
    let m = Map::default();
    let (sizes, r) = pieces(&m, &whole(1, 4));
    assert_eq!(sizes.len(), 1);
    assert_eq!(r.result.unwrap(), serde_json::json!([]));
    let (_, r) = pieces(&m, &page(10, None));
    assert_eq!(r.version, 2);
    assert_eq!(
        r.result.unwrap(),
        serde_json::json!({"claims": [], "continue": null})
    );
}

/// Reads every page of `limit`; the UIDs of each.
fn walk(m: &Map, limit: usize) -> Vec<Vec<String>> {
    let mut pages = vec![];
    let mut after: Option<String> = None;
    loop {
        let (_, r) = pieces(m, &page(limit, after.as_deref()));
        assert_eq!((r.version, r.id), (2, 3));
        let p: ClaimPage = serde_json::from_value(r.result.unwrap()).unwrap();
        assert!(p.claims.len() <= limit);
        pages.push(p.claims.iter().map(|c| c.uid.clone()).collect());
        match p.next {
            Some(next) => {
                assert_eq!(Some(&next), p.claims.last().map(|c| &c.uid));
                after = Some(next);
            }
            None => return pages,
        }
        assert!(pages.len() <= m.uids().len(), "pages do not end");
    }
}

#[test]
fn pages_list_every_claim_once_and_the_last_says_so() {
    let m = map(1000, 10);
    let all = m.uids();
    for limit in [1, 7, 64, 65, 100, 500, 999, 1000, 1001] {
        let pages = walk(&m, limit);
        let expected_pages = 1000usize.div_ceil(limit);
        assert_eq!(pages.len(), expected_pages, "limit {limit}");
        assert!(pages.iter().all(|p| !p.is_empty()), "limit {limit}");
        assert_eq!(pages.concat(), all, "limit {limit}");
    }
}

#[test]
fn claims_that_change_while_the_answer_is_written_are_listed_as_the_view_then_holds_them() {
    let m = map(400, 1000);
    let listing = whole(1, 1);
    let mut p = Pieces::new(&m, &listing);
    let mut line = p.next_piece().unwrap().unwrap().to_vec();
    assert!(
        line.len() < 100 * 1000,
        "the first piece holds a few claims"
    );
    // Between two pieces: a claim already written and one still to come are released, one
    // is prepared ahead of the answer and one behind it.
    for gone in ["c-00000", "c-00399"] {
        m.claims.borrow_mut().remove(gone);
    }
    for new in ["c-00000a", "c-99999"] {
        m.claims.borrow_mut().insert(
            new.into(),
            Arc::new(crate::claim::wire::claim_of(claim(new, 10))),
        );
    }
    while let Some(piece) = p.next_piece().unwrap() {
        line.extend_from_slice(piece);
    }
    let r: Response = serde_json::from_slice(&line).unwrap();
    let listed: Vec<ClaimInfo> = serde_json::from_value(r.result.unwrap()).unwrap();
    let uids: Vec<&str> = listed.iter().map(|c| c.uid.as_str()).collect();
    // Written before it went; gone before its turn; behind the answer; ahead of it.
    assert_eq!(uids.first(), Some(&"c-00000"));
    assert!(!uids.contains(&"c-00399"));
    assert!(!uids.contains(&"c-00000a"));
    assert_eq!(uids.last(), Some(&"c-99999"));
    // Every other claim once, in order.
    let mut expected: Vec<String> = (0..399).map(|i| format!("c-{i:05}")).collect();
    expected.push("c-99999".into());
    assert_eq!(uids, expected);
}

#[test]
fn list_claims_params_are_checked_by_version() {
    // Version 1 takes none, as it always did.
    assert_eq!(Listing::of(1, 2, None).unwrap(), whole(1, 2));
    let e = Listing::of(1, 2, Some(serde_json::json!({"limit": 5}))).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(
        e.message.contains("list_claims takes no params"),
        "{}",
        e.message
    );
    // Version 2: a page, at most MAX_CLAIMS_PAGE long.
    for none in [None, Some(Value::Null), Some(serde_json::json!({}))] {
        assert_eq!(
            Listing::of(2, 2, none).unwrap().page.unwrap(),
            Page {
                limit: MAX_CLAIMS_PAGE as usize,
                after: None
            }
        );
    }
    let l = Listing::of(
        2,
        2,
        Some(serde_json::json!({"limit": 100000, "continue": "c-00010"})),
    )
    .unwrap();
    assert_eq!(
        l.page,
        Some(Page {
            limit: MAX_CLAIMS_PAGE as usize,
            after: Some("c-00010".into())
        })
    );
    for (params, says) in [
        (serde_json::json!({"limit": 0}), "limit must be 1 or more"),
        (
            serde_json::json!({"continue": "../x"}),
            "is not the continue of a list_claims page",
        ),
        (serde_json::json!({"limt": 3}), "unknown field `limt`"),
        (serde_json::json!([3]), "params must be a JSON object"),
    ] {
        let e = Listing::of(2, 2, Some(params.clone())).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{params}");
        assert!(
            e.message.starts_with("params of list_claims: "),
            "{}",
            e.message
        );
        assert!(e.message.contains(says), "{params}: {}", e.message);
    }
}
