# Plots of one benchmark run: gnuplot -e "dir='build/bench-results/<run>'" bench/plots.gp
# Inputs are the .dat files bench/compare.py writes into that directory.
if (!exists("dir")) dir = "."

set terminal pngcairo size 900,560 font "DejaVu Sans,11"
set grid
set key top left

exists_file(f) = system("test -s ".dir."/".f." && echo 1") eq "1"

# Node CPU for tracking against the churn rate, per N: the median of the repeats, the band their
# min-max; ebpf and relist, churn in one pod and spread over N/5 pods.
do for [n in "3 10 50 110 250 500"] {
  one = "node_cpu_n".n."_one.dat"
  spr = "node_cpu_n".n."_spread.dat"
  if (exists_file(one) || exists_file(spr)) {
    set output dir."/node_cpu_n".n.".png"
    set title "Node CPU for tracking, N=".n." pods (above the same workload with no daemon)"
    set xlabel "churn, transitions per second (scheduled)"
    set ylabel "millicores (median of repeats; band: min-max)"
    set style fill transparent solid 0.15 noborder
    cmd = ""
    if (exists_file(one)) {
      cmd = cmd . sprintf("'%s/%s' using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'ebpf, one pod', ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:6:7 with filledcurves lc rgb '#d62728' notitle, ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:5 with linespoints lw 2 pt 5 lc rgb '#d62728' title 'relist, one pod', ", dir, one)
    }
    if (exists_file(spr)) {
      cmd = cmd . sprintf("'%s/%s' using 1:3:4 with filledcurves lc rgb '#2ca02c' notitle, ", dir, spr)
      cmd = cmd . sprintf("'%s/%s' using 1:2 with linespoints lw 2 dt 2 pt 7 lc rgb '#2ca02c' title 'ebpf, spread over N/5 pods', ", dir, spr)
      cmd = cmd . sprintf("'%s/%s' using 1:6:7 with filledcurves lc rgb '#ff7f0e' notitle, ", dir, spr)
      cmd = cmd . sprintf("'%s/%s' using 1:5 with linespoints lw 2 dt 2 pt 5 lc rgb '#ff7f0e' title 'relist, spread over N/5 pods', ", dir, spr)
    }
    eval("plot " . cmd . "0 with lines lc rgb 'black' lw 1 notitle")
  }
  # The daemon's own part (its cgroup + BPF), which the machine's noise does not swamp.
  one = "daemon_cpu_n".n."_one.dat"
  spr = "daemon_cpu_n".n."_spread.dat"
  if (exists_file(one) || exists_file(spr)) {
    set output dir."/daemon_cpu_n".n.".png"
    set title "The daemon's own CPU (cgroup + BPF programs), N=".n." pods"
    set xlabel "churn, transitions per second (scheduled)"
    set ylabel "millicores (median of repeats; band: min-max)"
    cmd = ""
    if (exists_file(one)) {
      cmd = cmd . sprintf("'%s/%s' using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'ebpf, one pod', ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:6:7 with filledcurves lc rgb '#d62728' notitle, ", dir, one)
      cmd = cmd . sprintf("'%s/%s' using 1:5 with linespoints lw 2 pt 5 lc rgb '#d62728' title 'relist, one pod', ", dir, one)
    }
    if (exists_file(spr)) {
      cmd = cmd . sprintf("'%s/%s' using 1:2 with linespoints lw 2 dt 2 pt 7 lc rgb '#2ca02c' title 'ebpf, spread', ", dir, spr)
      cmd = cmd . sprintf("'%s/%s' using 1:5 with linespoints lw 2 dt 2 pt 5 lc rgb '#ff7f0e' title 'relist, spread', ", dir, spr)
    }
    eval("plot " . cmd . "0 with lines lc rgb 'black' lw 1 notitle")
  }
}

# Latency CDFs, every churn window: from the start of the CRI call that made the transition to
# the Watch consumer.
if (exists_file("latency_ebpf_started.dat")) {
  set output dir."/latency_cdf.png"
  set title "ContainerStarted and ContainerDied: CRI call start to consumer, every churn window"
  set xlabel "ms (log)"
  set ylabel "fraction of transitions"
  set logscale x
  set key bottom right
  plot dir."/latency_ebpf_started.dat" using 1:2 with lines lw 2 lc rgb '#1f77b4' title "ebpf Started", \
       dir."/latency_ebpf_died.dat" using 1:2 with lines lw 2 dt 2 lc rgb '#1f77b4' title "ebpf Died", \
       dir."/latency_relist_started.dat" using 1:2 with lines lw 2 lc rgb '#d62728' title "relist Started", \
       dir."/latency_relist_died.dat" using 1:2 with lines lw 2 dt 2 lc rgb '#d62728' title "relist Died"
  unset logscale x
  set key top left
}

# Memory against N (idle windows).
if (exists_file("memory_vs_n.dat")) {
  set output dir."/memory_vs_n.png"
  set title "Daemon memory against pods (idle windows, median)"
  set xlabel "pods N"
  set ylabel "MiB"
  plot dir."/memory_vs_n.dat" using 1:2 with linespoints lw 2 pt 7 title "kplegd ebpf RSS", \
       ""                    using 1:3 with linespoints lw 2 pt 5 title "kplegd relist RSS", \
       ""                    using 1:4 with linespoints lw 2 pt 9 title "ebpf BPF maps (memlock)"
}
