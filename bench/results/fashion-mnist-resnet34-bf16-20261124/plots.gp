# ringtrain report: the plots of this run's metrics.jsonl (run `gnuplot plots.gp` in this folder)
set terminal pngcairo size 1100,650 noenhanced font 'sans,11'
set datafile separator '\t'
set datafile missing 'NaN'

# (1) training loss and test accuracy against step
reset
set output 'loss.png'
set title 'Training loss and test accuracy'
set xlabel 'step (optimizer steps)'
set ylabel 'loss (cross-entropy)'
set grid
set key outside bottom center horizontal
set ytics nomirror
set yrange [0:2.7921]
set y2label 'test accuracy (%)'
set y2tics
plot 'loss.dat' using 1:3 with lines lc rgb '#9ecae1' title 'training loss (each step)', \
     '' using 1:4 with lines lw 2 lc rgb '#08519c' title 'training loss (mean of 300 steps)', \
     'eval.dat' using 1:4 with linespoints pt 6 lc rgb '#ff7f0e' title 'test loss', \
     'eval.dat' using 1:3 axes x1y2 with linespoints pt 7 lw 2 lc rgb '#d62728' title 'test accuracy (%, right axis)'

# (2) the stages of a step, stacked
reset
set output 'stages.png'
set title 'Time per step by stage (mean over each epoch)'
set xlabel 'epoch'
set ylabel 'time per step (ms)'
set yrange [0:*]
set grid ytics
set key outside right top title 'stage' reverse Left
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border rgb '#333333'
set boxwidth 0.8 relative
set xtics rotate by -60
plot 'stages.dat' using 2:xtic(1) lc rgb '#1f77b4' title 'data', \
     '' using 3 lc rgb '#ff7f0e' title 'h2d', \
     '' using 4 lc rgb '#2ca02c' title 'forward', \
     '' using 5 lc rgb '#d62728' title 'backward', \
     '' using 6 lc rgb '#9467bd' title 'comm', \
     '' using 7 lc rgb '#8c564b' title 'optim', \
     '' using 8 lc rgb '#dddddd' title 'other (step - stages)'

# (3) images/s over time
reset
set output 'throughput.png'
set title 'Training throughput'
set xlabel 'wall time since the run started (s)'
set ylabel 'throughput (images/s, all ranks)'
set yrange [0:*]
set grid
set key outside bottom center horizontal
plot 'throughput.dat' using 1:3 with lines lc rgb '#bbbbbb' title 'each step', \
     '' using 1:4 with lines lw 2 lc rgb '#2ca02c' title 'mean of 300 steps'
