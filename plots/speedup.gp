# speedup.gp - speedup and time per epoch against the number of ranks.
# Input runs/speedup/speedup_<model>.csv (tools/speedup.sh) with columns
#   world_size,seconds_per_epoch,samples_per_s,speedup,efficiency,final_loss,
#   seconds_min,seconds_max,speedup_min,speedup_max
# (medians over interleaved rounds, and their ranges: the error bars).
# Called by plots/make_plots.sh with -e "outfile='...'; small='...'; large='...'; subtitle='...'".
set terminal pngcairo size 1200,520 noenhanced
set output outfile
set datafile separator ','
set multiplot layout 1,2 title "04/05 data-parallel speedup (median of the rounds; bars: min-max)\n".subtitle
set grid
set key top left
set xlabel 'ranks (world size)'
set ylabel 'speedup over 1 rank'
set xtics 1
stats small using 1 skip 1 nooutput
maxw = STATS_max
stats large using 10 skip 1 nooutput
top = STATS_max > maxw ? STATS_max : maxw
set xrange [0.8:maxw+0.2]
set yrange [0:top+0.5]
plot x with lines dt 2 lc rgb '#888888' title 'ideal', \
     small using 1:4:9:10 skip 1 with yerrorlines pt 7 lc rgb '#9400d3' title 'small model (D=1)', \
     large using 1:4:9:10 skip 1 with yerrorlines pt 5 lc rgb '#009e73' title 'large model (D=2048)'
set ylabel 'seconds per epoch'
set logscale y
set format y '%g'
set yrange [*:*]
plot small using 1:2:7:8 skip 1 with yerrorlines pt 7 lc rgb '#9400d3' title 'small model (D=1)', \
     large using 1:2:7:8 skip 1 with yerrorlines pt 5 lc rgb '#009e73' title 'large model (D=2048)'
unset multiplot
