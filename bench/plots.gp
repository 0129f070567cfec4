# Plots of one benchmark run: gnuplot -e "dir='bench/results/<timestamp>'" bench/plots.gp
# Inputs are the .dat files bench/compare.py writes into that directory.
if (!exists("dir")) dir = "."

set terminal pngcairo size 900,560 font "DejaVu Sans,11"
set grid
set key top left

has_data(f) = system("grep -qv '^#' ".dir."/".f." 2>/dev/null && echo 1") eq "1"

# CPU of each daemon against the pod count, idle (no churn), when measured (a run with churn
# rates only has none). Log scale: the modes are orders of magnitude apart; a zero reading is
# drawn at the floor.
floor = 1e-4
pos(x) = (x > floor ? x : floor)
# One pod count only (a run with one --counts value): a range around it, not an empty one.
if (has_data("cpu_vs_n.dat")) {
  stats dir."/cpu_vs_n.dat" using 1 nooutput
  if (STATS_min == STATS_max) { set xrange [STATS_min - 1 : STATS_max + 1] }
  set output dir."/cpu_vs_n.png"
  set title "Idle CPU vs pods (1 container each), both daemons on the same containerd"
  set xlabel "pods N"
  set ylabel "CPU seconds per minute (log)"
  set logscale y
  set format y "%g"
  plot dir."/cpu_vs_n.dat" using 1:(pos($3)) with linespoints lw 2 pt 7 title "kplegd ebpf (daemon + BPF programs)", \
       ""                 using 1:(pos($4)) with linespoints lw 2 pt 5 title "kplegd relist (daemon)", \
       ""                 using 1:(pos($5)) with linespoints lw 2 pt 9 dt 2 title "containerd + shims (loaded by both)"
  unset logscale y

  # Memory.
  set output dir."/rss_vs_n.png"
  set title "Daemon RSS vs pods"
  set ylabel "VmRSS MiB"
  plot dir."/cpu_vs_n.dat" using 1:6 with linespoints lw 2 pt 7 title "kplegd ebpf", \
       ""                 using 1:7 with linespoints lw 2 pt 5 title "kplegd relist"
}

set autoscale x

# Detection latency CDF, all churn windows pooled: ContainerStarted and ContainerDied, from the
# kernel's timestamp of the transition to arrival at the consumer.
# Only when a churn window measured latencies (an idle-only run has none).
if (has_data("latency_cdf_ebpf_started.dat") || has_data("latency_cdf_relist_started.dat")) {
  set output dir."/latency_cdf.png"
  set title "Detection latency (kernel timestamp to consumer), ContainerStarted + ContainerDied"
  set xlabel "latency ms (log)"
  set ylabel "fraction of transitions"
  set logscale x
  set yrange [0:1]
  set key top left
  plot dir."/latency_cdf_ebpf_started.dat"   using 1:2 with steps lw 2 lc rgb "#1f77b4" title "ebpf ContainerStarted", \
       dir."/latency_cdf_ebpf_died.dat"      using 1:2 with steps lw 2 lc rgb "#1f77b4" dt 2 title "ebpf ContainerDied", \
       dir."/latency_cdf_relist_started.dat" using 1:2 with steps lw 2 lc rgb "#d62728" title "relist ContainerStarted", \
       dir."/latency_cdf_relist_died.dat"    using 1:2 with steps lw 2 lc rgb "#d62728" dt 2 title "relist ContainerDied"
}

# CPU of each daemon against the pod count under churn (10 transitions/s), when measured.
unset logscale x
set yrange [*:*]
if (system("test -s ".dir."/cpu_vs_n_r10.dat && echo 1") eq "1") {
  set output dir."/cpu_vs_n_churn10.png"
  set title "CPU vs pods under churn of 10 transitions/s, both daemons on the same containerd"
  set xlabel "pods N"
  set ylabel "CPU seconds per minute"
  set yrange [0:*]
  plot dir."/cpu_vs_n_r10.dat" using 1:3 with linespoints lw 2 pt 7 title "kplegd ebpf (daemon + BPF programs)", \
       ""                      using 1:4 with linespoints lw 2 pt 5 title "kplegd relist (daemon)"
}

# How far events trail the runtime: from the return of the CRI call that made the transition
# (the runtime knows the new state by then) to the consumer. Values <= 0 are drawn at 0.1 ms.
if (has_data("lag_cdf_ebpf_started.dat") || has_data("lag_cdf_relist_started.dat")) {
  set output dir."/lag_cdf.png"
  set title "Event after the runtime's own answer (end of the CRI call) to consumer"
  set xlabel "ms after the CRI call returned (log; <= 0.1 ms: before it returned)"
  set ylabel "fraction of transitions"
  set logscale x
  set yrange [0:1]
  set key top left
  plot dir."/lag_cdf_ebpf_started.dat"   using 1:2 with steps lw 2 lc rgb "#1f77b4" title "ebpf ContainerStarted", \
       dir."/lag_cdf_ebpf_died.dat"      using 1:2 with steps lw 2 lc rgb "#1f77b4" dt 2 title "ebpf ContainerDied", \
       dir."/lag_cdf_ebpf_removed.dat"   using 1:2 with steps lw 2 lc rgb "#1f77b4" dt 3 title "ebpf ContainerRemoved", \
       dir."/lag_cdf_relist_started.dat" using 1:2 with steps lw 2 lc rgb "#d62728" title "relist ContainerStarted", \
       dir."/lag_cdf_relist_died.dat"    using 1:2 with steps lw 2 lc rgb "#d62728" dt 2 title "relist ContainerDied", \
       dir."/lag_cdf_relist_removed.dat" using 1:2 with steps lw 2 lc rgb "#d62728" dt 3 title "relist ContainerRemoved"
}
