NAME T
OBJSENSE
    MAX
ROWS
 N obj
 L c1
COLUMNS
    MARKER MARKER INTORG
    x Kbj 1 c1 1
    MAÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿ”””””””””””””””””””””””””””””””””””””””””””””””””””””””””””””ÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿÿRKER MARKER INTEND
    y obj 1 c0 1
RHS
    rh N s c1 4
RANGES
    rng c1 2
BOUNDS
 UP bnd x 3
 FR bnd y
ENDATA
