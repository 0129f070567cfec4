// How kplegctl prints kpleg.v1 messages: aligned tables for people, one JSON object per line
// for programs (field names as in kplegd --print-events json, plus the status snapshot).
#pragma once

#include <string>

#include "kpleg/v1/pleg.pb.h"

namespace kpleg::kplegctl {

std::string type_name(v1::EventType t);      // "ContainerStarted", ..., "Resync"
std::string source_name(v1::EventSource s);  // "kernel", "relist", "reconcile", "" for none
std::string state_name(v1::ContainerState s);

std::string event_json(const v1::Event& ev);
std::string event_table_header();
std::string event_table_row(const v1::Event& ev);

std::string list_json(const v1::ListResponse& resp);
std::string list_table(const v1::ListResponse& resp);

std::string stats_json(const v1::StatsResponse& resp);
std::string stats_text(const v1::StatsResponse& resp);

// `kplegctl stuck`: a table of calls (AGE, METHOD, POD, CONTAINER, ORIGIN) or JSON lines.
std::string inflight_table(const v1::InflightCallsResponse& resp);
std::string inflight_json(const v1::InflightCallsResponse& resp);

// "15:04:05.123" in local time; "-" for 0.
std::string clock_time(uint64_t unix_ns);

}  // namespace kpleg::kplegctl
