# plots/08_gpt_tokens.gp - chapter 08's training speed (tokens/s) against the step.
# Reads the tokens_per_s column of runs/08_gpt_wikitext/metrics.csv; called by
# plots/make_plots.sh with -e "outfile='...'; infile='...'; subtitle='device | backend | date'".
if (!exists("infile")) infile = "runs/08_gpt_wikitext/metrics.csv"
if (!exists("outfile")) outfile = "runs/plots/08_gpt_tokens.png"
if (!exists("subtitle")) subtitle = ""
set terminal pngcairo size 900,480 noenhanced
set output outfile
set datafile separator ","
set datafile missing ""
set title "08_gpt_wikitext: training throughput (all ranks together)" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "step"
set ylabel "tokens/s"
set yrange [0:*]
set grid
set key bottom right
plot infile using 1:5 skip 1 with linespoints pt 7 ps 0.5 title "tokens/s"
