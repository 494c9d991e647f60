use serde_json::Value;

use super::*;
use crate::category::Category;
use crate::event::Bind;
use crate::json::Quoted;

#[test]
fn spans_are_written_as_today_byte_for_byte() {
    let mut w = EventWriter::new();
    let name = Quoted::new("drafter.fc");
    w.span(&Span {
        cat: Category::Cpu,
        name: Text::Quoted(&name),
        pid: 4242,
        tid: 2,
        ts_ns: 1_523_125,
        dur_ns: 40_500,
        bind: Some(Bind::source(17)),
        args: &[Arg {
            key: "step",
            value: ArgValue::U64(12),
        }],
    });
    w.span(&Span {
        cat: Category::Gpu,
        name: Text::Plain("drafter.fc"),
        pid: 0,
        tid: 1,
        ts_ns: 1_530_002,
        dur_ns: 35_250,
        bind: Some(Bind::destination(17)),
        args: &[
            Arg {
                key: "step",
                value: ArgValue::U64(12),
            },
            Arg {
                key: "cpu_ts",
                value: ArgValue::Micros(1_523_125),
            },
        ],
    });
    w.span(&Span {
        cat: Category::Step,
        name: Text::Step(3),
        pid: 4242,
        tid: 2,
        ts_ns: 7,
        dur_ns: 0,
        bind: None,
        args: &[],
    });
    assert_eq!(
        w.as_str(),
        "{\"ph\":\"X\",\"cat\":\"cpu\",\"name\":\"drafter.fc\",\"pid\":4242,\"tid\":2,\"ts\":1523.125,\"dur\":40.500,\"bind_id\":17,\"flow_out\":true,\"args\":{\"step\":12}},\n\
         {\"ph\":\"X\",\"cat\":\"gpu\",\"name\":\"drafter.fc\",\"pid\":0,\"tid\":1,\"ts\":1530.002,\"dur\":35.250,\"bind_id\":17,\"flow_in\":true,\"args\":{\"step\":12,\"cpu_ts\":1523.125}},\n\
         {\"ph\":\"X\",\"cat\":\"step\",\"name\":\"ProfilerStep#3\",\"pid\":4242,\"tid\":2,\"ts\":0.007,\"dur\":0.000}"
    );
    assert_eq!(w.events(), 3);
}

#[test]
fn every_event_kind_parses_with_its_fields() {
    let mut w = EventWriter::new();
    w.meta(&Meta::ProcessName {
        pid: 9,
        name: "dflash \"trainer\"",
    });
    w.meta(&Meta::ProcessSortIndex { pid: 9, index: 0 });
    w.meta(&Meta::ThreadName {
        pid: 9,
        tid: 3,
        name: "drafter\ncuda:0",
    });
    w.meta(&Meta::ThreadSortIndex {
        pid: 9,
        tid: 3,
        index: 3,
    });
    w.counter(&Counter {
        cat: Text::Plain("queue"),
        name: Text::Plain("queue"),
        pid: 9,
        ts_ns: 1500,
        args: &[Arg {
            key: "depth",
            value: 3.0f64.into(),
        }],
    });
    for (dir, tid) in [(FlowDir::Out, 3), (FlowDir::In, 7)] {
        w.flow(&Flow {
            dir,
            id: 42,
            cat: Category::Ac2g,
            name: "ac2g",
            pid: 9,
            tid,
            ts_ns: 2000,
        });
    }
    w.span(&Span {
        cat: Category::Queue,
        name: Text::Plain("queue.put"),
        pid: 9,
        tid: 3,
        ts_ns: 0,
        dur_ns: 1,
        bind: Some(Bind {
            id: 5,
            flow_out: true,
            flow_in: true,
        }),
        args: &[
            Arg {
                key: "k\"ey",
                value: ArgValue::I64(-3),
            },
            Arg {
                key: "nan",
                value: ArgValue::F64(f64::NAN),
            },
            Arg {
                key: "small",
                value: ArgValue::F64(1e-7),
            },
        ],
    });
    w.finish();
    let text = w.as_str().to_string();
    assert!(text.ends_with("\n]}\n"));
    let body = text.trim_end_matches(crate::header::FOOTER);
    let evs: Vec<Value> = serde_json::from_str(&format!("[{body}]")).expect("valid JSON events");
    assert_eq!(evs.len(), 8);
    assert_eq!(evs[0]["ph"], "M");
    assert_eq!(evs[0]["name"], "process_name");
    assert_eq!(evs[0]["tid"], 0);
    assert_eq!(evs[0]["args"]["name"], "dflash \"trainer\"");
    assert_eq!(evs[1]["args"]["sort_index"], 0);
    assert_eq!(evs[2]["args"]["name"], "drafter\ncuda:0");
    assert_eq!(evs[3]["name"], "thread_sort_index");
    assert_eq!(evs[3]["args"]["sort_index"], 3);
    assert_eq!(evs[4]["ph"], "C");
    assert_eq!(evs[4]["cat"], "queue");
    assert_eq!(evs[4]["ts"].as_f64(), Some(1.5));
    assert_eq!(evs[4]["args"]["depth"].as_f64(), Some(3.0));
    assert_eq!((&evs[5]["ph"], &evs[6]["ph"]), (&"s".into(), &"f".into()));
    assert_eq!(evs[5]["id"], 42);
    assert_eq!(evs[6]["bp"], "e");
    assert_eq!(evs[6]["cat"], "ac2g");
    assert_eq!(evs[6]["tid"], 7);
    let s = &evs[7];
    assert_eq!(s["flow_out"], true);
    assert_eq!(s["flow_in"], true);
    assert_eq!(s["bind_id"], 5);
    assert_eq!(s["args"]["k\"ey"], -3);
    assert!(s["args"]["nan"].is_null());
    assert_eq!(s["args"]["small"].as_f64(), Some(1e-7));
}

#[test]
fn values() {
    let mut s = String::new();
    for v in [
        ArgValue::I64(-3),
        ArgValue::U64(u64::MAX),
        ArgValue::F64(0.25),
        ArgValue::F64(1e-7),
        ArgValue::F64(f64::NAN),
    ] {
        push_value(&mut s, v);
        s.push(',');
    }
    assert_eq!(s, "-3,18446744073709551615,0.25,0.0000001,null,");
}

#[test]
fn micros_print_like_timestamps() {
    let mut s = String::new();
    for ns in [1_000_001, 7, 0] {
        push_value(&mut s, ArgValue::Micros(ns));
        s.push(',');
    }
    assert_eq!(s, "1000.001,0.007,0.000,");
}

#[test]
fn a_bind_without_direction_is_left_out_and_drain_empties() {
    let mut w = EventWriter::with_capacity(64);
    w.span(&Span {
        cat: Category::Unknown,
        name: Text::Plain("x"),
        pid: 1,
        tid: 1,
        ts_ns: 0,
        dur_ns: 0,
        bind: Some(Bind {
            id: 3,
            flow_out: false,
            flow_in: false,
        }),
        args: &[],
    });
    assert!(!w.as_str().contains("bind_id"));
    assert!(w.as_str().contains("\"cat\":\"\""));
    let mut out = Vec::new();
    w.drain_into(&mut out).unwrap();
    assert!(w.is_empty() && w.as_str().is_empty());
    assert_eq!(w.events(), 1);
    assert!(out.starts_with(b"{\"ph\":\"X\""));
}

#[test]
fn triples_print_as_arrays_that_json_reads_back() {
    let mut s = String::new();
    push_value(&mut s, ArgValue::Triple([128, 1, -2]));
    assert_eq!(s, "[128,1,-2]");
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(v, serde_json::json!([128, 1, -2]));
}
