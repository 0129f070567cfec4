// Who a pod is: the one shape in which every folder carries a pod's identity (the runtime
// view's lists and looks, the tracker's records, List's answer, the in-flight call registry).
// It lives here, below cri/ and pleg/, so that all of them can include it without a cycle.
#pragma once

#include <string>

namespace kpleg {

struct PodIdentity {
  std::string uid;
  std::string name;
  std::string namespace_;
  // True when the uid came from the kubelet's labels (so the pod can be selected by label).
  bool labelled = false;
};

}  // namespace kpleg
