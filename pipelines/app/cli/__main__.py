from pipelines.app.cli import main

main()
