# 01_loss.gp - chapter 01's loss curve.
# Input runs/01_single_gpu/loss.csv (step,epoch,loss); called by plots/make_plots.sh
# with -e "outfile='...'; infile='...'; subtitle='device | date'".
set terminal pngcairo size 900,560 noenhanced
set output outfile
set datafile separator ','
set title "01_single_gpu: training loss (mean of 100 batches)\n".subtitle
set xlabel 'step'
set ylabel 'loss (MSE)'
set logscale y
set grid
set key top right
plot infile using 1:3 skip 1 with linespoints pt 7 ps 0.5 title 'training loss', \
     0.01 with lines dt 2 lc rgb '#888888' title 'noise floor 0.01'
