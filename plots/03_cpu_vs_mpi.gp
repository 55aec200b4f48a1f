# plots/03_cpu_vs_mpi.gp - the cpu backend's time divided by MPI's, against
# size: one panel per number of ranks, one curve per operation, bars from the
# lowest to the highest ratio of a single round (chapter 03).
#
# Reads the CSV that `03_collectives/bench/compare_mpi.sh -o FILE` writes
# (default docs/03-cpu-vs-mpi.csv, the measurement shown in 03_collectives/MEASUREMENTS.md)
# and draws docs/03-cpu-vs-mpi.png. Run it from the project root:
#     gnuplot plots/03_cpu_vs_mpi.gp
#     gnuplot -e "csv='mine.csv'; out='mine.png'" plots/03_cpu_vs_mpi.gp
# Below the line at 1 the cpu backend is faster.

if (!exists("csv")) csv = "docs/03-cpu-vs-mpi.csv"
if (!exists("out")) out = "docs/03-cpu-vs-mpi.png"
if (system("test -s '" . csv . "' && echo yes") ne "yes") {
    print "03_cpu_vs_mpi.gp: no " . csv . " (run 03_collectives/bench/compare_mpi.sh -o " . csv . "); nothing to draw"
    exit
}
info = system("sed -n 's/^# //p' '" . csv . "' | head -n 1")
ops = system("awk -F, 'NR > 1 && !/^#/ && !seen[$1]++ { printf \"%s \", $1 }' '" . csv . "'")
rank_counts = system("awk -F, 'NR > 1 && !/^#/ && !seen[$2]++ { printf \"%s \", $2 }' '" . csv . "'")

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1200,520 font ",10"
} else {
    set terminal png size 1200,520
}
set output out
set termoption noenhanced   # all_reduce keeps its underscore
set datafile separator ","
set logscale x 2
set xtics ("8" 8, "128" 128, "2K" 2048, "32K" 32768, "512K" 524288, "8M" 8388608, "256M" 268435456)
set xrange [5:4.5e8]
set xlabel "size (bytes)"
set logscale y 2
set ytics (0.015625, 0.03125, 0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16)
set yrange [0.015:20]
set ylabel "time of cpu / time of MPI"
set grid
set key left top
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead lw 2 lc rgb "#7F7F7F"
colours = "#0072B2 #E69F00 #009E73 #D55E00"
points = "9 7 13 5"
n_panels = words(rank_counts)
set multiplot layout 1, n_panels title "03_collectives: the cpu backend against MPI's shared memory, same machine, same runs\n" . info
do for [p = 1:n_panels] {
    n = word(rank_counts, p)
    set title n . " ranks"
    plot for [k = 1:words(ops)] csv skip 1 \
         using ((strcol(1) eq word(ops, k) && $2 == n + 0) ? $3 : 1/0):6:7:8 \
         with yerrorlines lc rgb word(colours, k) pt int(word(points, k)) ps 0.8 lw 2 title word(ops, k)
}
unset multiplot
print "03_cpu_vs_mpi.gp: wrote " . out
