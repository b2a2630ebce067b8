from recprof.cli import main

main()
