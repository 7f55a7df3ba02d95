from gpuq.cli.main import main

main()
