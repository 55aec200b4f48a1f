# plots/13_capacity.gp - chapter 13: the share of the assignments dropped
# against the capacity factor (an expert takes at most ceil(f n K / E) of a
# micro-batch's n tokens), per layer, after a short training run on
# WikiText-2 each.
#
# Reads a CSV, capacity_factor,layer,dropped (a fraction), which make plots
# collects from the runs' routing tables into
# runs/13_expert_parallel/capacity.csv. From the project root:
#     gnuplot -e "infile='runs/13_expert_parallel/capacity.csv'" plots/13_capacity.gp
if (!exists("infile")) infile = "runs/13_expert_parallel/capacity.csv"
if (!exists("outfile")) outfile = "runs/plots/13_capacity.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . infile . "' && echo yes") ne "yes") {
    print "13_capacity.gp: no " . infile . " yet (make plots measures it); nothing to draw"
    exit
}
system "mkdir -p \"$(dirname '" . outfile . "')\""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,560 noenhanced
} else {
    set terminal png size 900,560
}
set termoption noenhanced
set output outfile
set datafile separator ","
set title "13_expert_parallel: assignments dropped against the capacity factor" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "capacity factor f"
set ylabel "dropped (% of the layer's assignments)"
set yrange [0:*]
set grid
set key top right
# rows alternate layer 0, layer 1 for each factor (every 2::l picks one layer)
plot for [l = 0:1] infile using 1:(100 * column(3)) skip 1 every 2::l with linespoints pointtype 7 linewidth 2 title sprintf("layer %d", l)
