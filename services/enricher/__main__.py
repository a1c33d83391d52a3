from services.enricher.main import main

main()
