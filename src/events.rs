//! Events about pods and their containers, recorded as the kubelet's event
//! recorder does (client-go `tools/record`): core/v1 Events with source
//! `kubelet`/<node>, the kubelet's reasons, the container field path
//! (`spec.containers{name}`) in `involvedObject`, and the kubelet's
//! `EventCorrelator` in front of the API server:
//!
//! - **spam filter**: at most 25 events per object in a burst, then one per
//!   5 minutes (`EventSourceObjectSpamFilter`);
//! - **aggregation**: from the 11th distinct message with the same reason for
//!   the same object within 10 minutes, one event reads
//!   `(combined from similar events): <message>` (`EventAggregator`);
//! - **deduplication**: a repeat of an identical event patches `count` and
//!   `lastTimestamp` of the existing Event instead of creating one
//!   (`eventLogger`), so a crash loop is one Event with a growing count.
//!
//! kube's own `Recorder` keys its series without the message, so two events
//! with one reason and different messages would show only the first message;
//! that is why the recorder is built here on `kube::Api`.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;
use tracing::debug;

pub use kube::runtime::events::EventType;

/// Events in a burst per object before the spam filter limits them.
const SPAM_BURST: f64 = 25.0;
/// Seconds for the spam filter to earn one more event per object.
const SPAM_REFILL_SECS: f64 = 300.0;
/// Distinct messages per (object, reason) before they are combined.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// Seconds after which an aggregation record starts over.
const AGGREGATE_INTERVAL_SECS: i64 = 600;
/// Remembered events (and aggregation records) before the oldest are forgotten.
const CACHE_SIZE: usize = 4096;
/// Events waiting to be written before new ones are dropped (the kubelet's
/// broadcaster queue length).
const QUEUE_LEN: usize = 1000;
/// The prefix of an aggregated event's message, as the kubelet's.
const COMBINED: &str = "(combined from similar events): ";

/// The field path of a container in events: `spec.containers{name}`, or
/// `spec.initContainers{name}` for init containers and sidecars, or
/// `spec.ephemeralContainers{name}`.
#[must_use]
pub fn field_path(pod: &Pod, container: &str) -> String {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    let ephemeral = spec
        .and_then(|s| s.ephemeral_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    let list = match (init, ephemeral) {
        (true, _) => "initContainers",
        (false, true) => "ephemeralContainers",
        (false, false) => "containers",
    };
    format!("spec.{list}{{{container}}}")
}

/// Publishes an event about `pod` (or one of its containers) without waiting:
/// it is queued for the recorder's writer, and dropped (logged) when the queue
/// is full, as the kubelet's broadcaster does.
pub fn publish(
    recorder: &Recorder,
    pod: &Pod,
    container: Option<&str>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let mut object: ObjectReference = pod.object_ref(&());
    object.field_path = container.map(|c| field_path(pod, c));
    recorder.record(Draft::new(object, type_, reason, note, BTreeMap::new()));
}

/// Publishes an event about `pod` as [`publish`], with `annotations` on the
/// Event object, as the kubelet's `AnnotatedEventf` (the eviction manager's
/// `Evicted` events name the starved resource and the offending containers).
pub fn publish_annotated(
    recorder: &Recorder,
    pod: &Pod,
    type_: EventType,
    reason: &str,
    note: String,
    annotations: BTreeMap<String, String>,
) {
    recorder.record(Draft::new(
        pod.object_ref(&()),
        type_,
        reason,
        note,
        annotations,
    ));
}

/// Publishes an event about the Node `node` without waiting, as the kubelet
/// refers to its node (kind `Node`, name and UID the node's name; written in
/// `default`).
pub fn publish_node(recorder: &Recorder, node: &str, type_: EventType, reason: &str, note: String) {
    let object = ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    };
    recorder.record(Draft::new(object, type_, reason, note, BTreeMap::new()));
}

/// The kubelet's event recorder for one node: a cheap handle to a queue that
/// one background task drains, correlating and writing each event in order.
#[derive(Clone)]
pub struct Recorder {
    queue: mpsc::Sender<Draft>,
}

impl Recorder {
    /// A recorder writing through `client` as source `kubelet` on `node`; it
    /// spawns its writer, so it must be created inside a Tokio runtime.
    #[must_use]
    pub fn new(client: Client, node: String) -> Self {
        let (queue, mut rx) = mpsc::channel::<Draft>(QUEUE_LEN);
        tokio::spawn(async move {
            let mut correlator = Correlator::default();
            while let Some(draft) = rx.recv().await {
                let now = Timestamp::now();
                if let Some(write) = correlator.correlate(draft, now) {
                    let result = write_event(&client, &node, &write, now).await;
                    match result {
                        Ok(name) => correlator.written(&write.key, name),
                        Err(e) => {
                            debug!(error = %e, reason = write.draft.reason, "event not recorded")
                        }
                    }
                }
            }
        });
        Self { queue }
    }

    fn record(&self, mut draft: Draft) {
        bound_message(&mut draft.message);
        if let Err(e) = self.queue.try_send(draft) {
            debug!(error = %e, "event queue full: event dropped");
        }
    }
}

/// The longest event message kept, in bytes (the `note` limit of
/// events.k8s.io): a longer one (a pod spec's huge image reference quoted in
/// it) is cut, so that neither the correlator's caches nor the API server
/// get it whole.
pub const MAX_MESSAGE: usize = 1024;

/// Cuts `message` to at most [`MAX_MESSAGE`] bytes, at a character
/// boundary, ending it with `...` when cut.
fn bound_message(message: &mut String) {
    if message.len() <= MAX_MESSAGE {
        return;
    }
    message.truncate(message.floor_char_boundary(MAX_MESSAGE - 3));
    message.push_str("...");
}

/// An event as the agent reports it, before correlation.
#[derive(Clone, Debug, PartialEq)]
struct Draft {
    object: ObjectReference,
    type_: &'static str,
    reason: String,
    message: String,
    /// The Event object's annotations (set when it is created).
    annotations: BTreeMap<String, String>,
}

impl Draft {
    fn new(
        object: ObjectReference,
        type_: EventType,
        reason: &str,
        message: String,
        annotations: BTreeMap<String, String>,
    ) -> Self {
        Self {
            object,
            type_: match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            reason: reason.to_string(),
            message,
            annotations,
        }
    }

    /// The object's identity (the spam filter's key).
    fn object_key(&self) -> String {
        let o = &self.object;
        [
            o.api_version.as_deref(),
            o.kind.as_deref(),
            o.namespace.as_deref(),
            o.name.as_deref(),
            o.uid.as_deref(),
            o.field_path.as_deref(),
        ]
        .map(Option::unwrap_or_default)
        .join("\u{1f}")
    }

    /// Everything but the message (the aggregator's key).
    fn aggregate_key(&self) -> String {
        [self.object_key().as_str(), self.type_, &self.reason].join("\u{1f}")
    }

    /// Everything (the deduplication key).
    fn full_key(&self) -> String {
        [self.aggregate_key().as_str(), &self.message].join("\u{1f}")
    }
}

/// What the correlator decided to write.
#[derive(Clone, Debug, PartialEq)]
struct Write {
    draft: Draft,
    /// The deduplication key the Event is remembered under.
    key: String,
    /// The Event's count after this occurrence (1 = a new Event).
    count: i32,
    /// The first occurrence's time, kept across repeats.
    first: Timestamp,
    /// The existing Event to patch, for a repeat.
    existing: Option<String>,
}

/// A token bucket of the spam filter.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

/// The last occurrence of an Event already written.
#[derive(Clone, Debug)]
struct Seen {
    name: Option<String>,
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// The distinct messages seen for one aggregate key.
#[derive(Clone, Debug)]
struct Aggregate {
    messages: HashSet<String>,
    last: Timestamp,
}

/// The kubelet's `EventCorrelator`: spam filter, aggregator and deduplication,
/// with time passed in so it is a pure state machine.
#[derive(Default)]
struct Correlator {
    buckets: HashMap<String, Bucket>,
    aggregates: HashMap<String, Aggregate>,
    seen: HashMap<String, Seen>,
}

impl Correlator {
    /// Decides what to write for `draft` at `now`, or `None` when the spam
    /// filter drops it.
    fn correlate(&mut self, mut draft: Draft, now: Timestamp) -> Option<Write> {
        if !self.allow(&draft.object_key(), now) {
            return None;
        }
        let key = match self.aggregate(&draft, now) {
            Some(aggregate_key) => {
                draft.message = format!("{COMBINED}{}", draft.message);
                aggregate_key
            }
            None => draft.full_key(),
        };
        let seen = self.seen.get(&key);
        let write = Write {
            count: seen.map_or(1, |s| s.count + 1),
            first: seen.map_or(now, |s| s.first),
            existing: seen.and_then(|s| s.name.clone()),
            key: key.clone(),
            draft,
        };
        self.seen.insert(
            key,
            Seen {
                name: write.existing.clone(),
                count: write.count,
                first: write.first,
                last: now,
            },
        );
        evict_oldest(&mut self.seen, |s| s.last);
        Some(write)
    }

    /// Remembers the name of the Event written for `key`.
    fn written(&mut self, key: &str, name: String) {
        if let Some(s) = self.seen.get_mut(key) {
            s.name = Some(name);
        }
    }

    /// The spam filter: takes a token of the object's bucket if it has one.
    fn allow(&mut self, object: &str, now: Timestamp) -> bool {
        let bucket = self.buckets.entry(object.to_string()).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let earned = now.duration_since(bucket.at).as_secs_f64().max(0.0) / SPAM_REFILL_SECS;
        bucket.tokens = (bucket.tokens + earned).min(SPAM_BURST);
        bucket.at = now;
        let allowed = bucket.tokens >= 1.0;
        if allowed {
            bucket.tokens -= 1.0;
        }
        evict_oldest(&mut self.buckets, |b| b.at);
        allowed
    }

    /// The aggregator: the aggregate key when this message is one too many
    /// distinct messages for its object and reason, else `None`.
    fn aggregate(&mut self, draft: &Draft, now: Timestamp) -> Option<String> {
        let key = draft.aggregate_key();
        let record = self
            .aggregates
            .entry(key.clone())
            .or_insert_with(|| Aggregate {
                messages: HashSet::new(),
                last: now,
            });
        if now.duration_since(record.last).as_secs() > AGGREGATE_INTERVAL_SECS {
            record.messages.clear();
        }
        record.last = now;
        record.messages.insert(draft.message.clone());
        let combine = record.messages.len() > AGGREGATE_MAX_EVENTS;
        evict_oldest(&mut self.aggregates, |a| a.last);
        combine.then_some(key)
    }
}

/// Forgets the least recently used entry once `map` outgrows the cache size.
fn evict_oldest<V>(map: &mut HashMap<String, V>, last: impl Fn(&V) -> Timestamp) {
    if map.len() <= CACHE_SIZE {
        return;
    }
    if let Some(oldest) = map
        .iter()
        .min_by_key(|(_, v)| last(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

/// Creates the Event, or patches the existing one's count, message and
/// `lastTimestamp` for a repeat (creating it again if it is gone), as the
/// kubelet's `recordToSink`. Returns the Event's name.
async fn write_event(
    client: &Client,
    node: &str,
    write: &Write,
    now: Timestamp,
) -> kube::Result<String> {
    let draft = &write.draft;
    let ns = draft.object.namespace.as_deref().unwrap_or("default");
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    if let Some(name) = &write.existing {
        let patch = serde_json::json!({
            "count": write.count,
            "message": draft.message,
            "lastTimestamp": Time(now),
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => return Ok(name.clone()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let object_name = draft.object.name.as_deref().unwrap_or_default();
    let name = format!("{object_name}.{:x}", now.as_nanosecond());
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.to_string()),
            annotations: (!draft.annotations.is_empty()).then(|| draft.annotations.clone()),
            ..ObjectMeta::default()
        },
        involved_object: draft.object.clone(),
        reason: Some(draft.reason.clone()),
        message: Some(draft.message.clone()),
        type_: Some(draft.type_.to_string()),
        count: Some(write.count),
        first_timestamp: Some(Time(write.first)),
        last_timestamp: Some(Time(now)),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.to_string()),
        ..Event::default()
    };
    api.create(&PostParams::default(), &event).await?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let mut short = "fits".to_string();
        bound_message(&mut short);
        assert_eq!(short, "fits");
        let mut long = format!("{}é{}", "a".repeat(MAX_MESSAGE - 4), "b".repeat(1 << 20));
        bound_message(&mut long);
        assert!(long.len() <= MAX_MESSAGE, "{}", long.len());
        assert!(long.ends_with("..."));
        assert!(long.starts_with("aaaa"));
    }

    use super::*;

    fn draft(reason: &str, message: &str) -> Draft {
        Draft {
            object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some("p".into()),
                uid: Some("u1".into()),
                field_path: Some("spec.containers{c}".into()),
                ..ObjectReference::default()
            },
            type_: "Normal",
            reason: reason.into(),
            message: message.into(),
            annotations: BTreeMap::new(),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn identical_events_become_one_event_with_a_count() {
        let mut c = Correlator::default();
        let first = c
            .correlate(draft("Started", "Started container c"), at(0))
            .unwrap();
        assert_eq!((first.count, first.existing.as_deref()), (1, None));
        c.written(&first.key, "p.1".into());
        let again = c
            .correlate(draft("Started", "Started container c"), at(10))
            .unwrap();
        assert_eq!(again.count, 2);
        assert_eq!(again.existing.as_deref(), Some("p.1"));
        assert_eq!(again.first, at(0), "firstTimestamp is kept");
        assert_eq!(again.key, first.key);
    }

    #[test]
    fn a_new_message_with_the_same_reason_is_a_new_event() {
        let mut c = Correlator::default();
        let a = c
            .correlate(draft("FailedMount", "forbidden"), at(0))
            .unwrap();
        c.written(&a.key, "p.1".into());
        let b = c
            .correlate(draft("FailedMount", "not found"), at(1))
            .unwrap();
        assert_eq!((b.count, b.existing.as_deref()), (1, None));
        assert_eq!(b.draft.message, "not found");
    }

    #[test]
    fn the_eleventh_distinct_message_is_combined() {
        let mut c = Correlator::default();
        for i in 0..10 {
            let w = c
                .correlate(draft("Failed", &format!("m{i}")), at(i))
                .unwrap();
            assert_eq!(w.draft.message, format!("m{i}"));
        }
        let w = c.correlate(draft("Failed", "m10"), at(10)).unwrap();
        assert_eq!(w.draft.message, "(combined from similar events): m10");
        c.written(&w.key, "p.agg".into());
        let w = c.correlate(draft("Failed", "m11"), at(11)).unwrap();
        assert_eq!(w.draft.message, "(combined from similar events): m11");
        assert_eq!((w.count, w.existing.as_deref()), (2, Some("p.agg")));
        // Another reason is aggregated on its own.
        let other = c.correlate(draft("Pulled", "m0"), at(12)).unwrap();
        assert_eq!(other.draft.message, "m0");
        // Ten minutes of quiet start the record over.
        let later = c.correlate(draft("Failed", "m12"), at(11 + 601)).unwrap();
        assert_eq!(later.draft.message, "m12");
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_then_one_per_5_minutes() {
        let mut c = Correlator::default();
        let allowed = (0..30)
            .filter(|i| {
                c.correlate(draft("BackOff", "again"), at(*i / 10))
                    .is_some()
            })
            .count();
        assert_eq!(allowed, 25);
        assert!(c.correlate(draft("BackOff", "again"), at(100)).is_none());
        assert!(c.correlate(draft("BackOff", "again"), at(310)).is_some());
        assert!(c.correlate(draft("BackOff", "again"), at(311)).is_none());
        // Another object has its own bucket.
        let mut other = draft("BackOff", "again");
        other.object.uid = Some("u2".into());
        assert!(c.correlate(other, at(311)).is_some());
    }

    #[test]
    fn the_caches_are_bounded() {
        let mut c = Correlator::default();
        for i in 0..(CACHE_SIZE as i64 + 10) {
            let mut d = draft("Started", "x");
            d.object.uid = Some(format!("u{i}"));
            c.correlate(d, at(i));
        }
        assert_eq!(c.seen.len(), CACHE_SIZE);
        assert_eq!(c.buckets.len(), CACHE_SIZE);
        assert_eq!(c.aggregates.len(), CACHE_SIZE);
    }

    #[test]
    fn field_paths_name_the_kind_of_container() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "spec": {
                "initContainers": [{ "name": "i" }],
                "containers": [{ "name": "c" }],
                "ephemeralContainers": [{ "name": "e" }]
            }
        }))
        .unwrap();
        assert_eq!(field_path(&pod, "i"), "spec.initContainers{i}");
        assert_eq!(field_path(&pod, "c"), "spec.containers{c}");
        assert_eq!(field_path(&pod, "e"), "spec.ephemeralContainers{e}");
    }
}
